package manifest

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stagehost/stagehost/errdefs"
)

func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "m.wasm")
	if err := os.WriteFile(file, []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadFile(file, 10); err != nil || string(b) != "0123456789" {
		t.Errorf("at the limit: %q %v", b, err)
	}
	if b, err := ReadFile(file, 9); !errors.Is(err, ErrTooLarge) || b != nil {
		t.Errorf("one byte over: %q %v", b, err)
	}
	if _, err := ReadFile(filepath.Join(dir, "nope"), 10); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing: %v", err)
	}
	if _, err := ReadFile(dir, 10); !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), "it is a directory") {
		t.Errorf("directory: %v", err)
	}
	if runtime.GOOS != "linux" {
		t.Skip("devices, named pipes and procfs are Linux's here")
	}
	if _, err := ReadFile("/dev/zero", 1<<30); !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), "it is a character device") {
		t.Errorf("/dev/zero: %v", err)
	}
	link := filepath.Join(dir, "zero.wasm")
	if err := os.Symlink("/dev/zero", link); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(link, 1<<30); !errors.Is(err, ErrNotRegular) {
		t.Errorf("a link to /dev/zero: %v", err)
	}
	// A named pipe with no writer: opening it must not wait for one.
	fifo := filepath.Join(dir, "fifo.wasm")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(fifo, 1<<30); !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), "it is a named pipe") {
		t.Errorf("named pipe: %v", err)
	}
	// procfs files are regular but stat as empty: the limit holds on what
	// is read, not on what stat says.
	if fi, err := os.Stat("/proc/self/status"); err == nil && fi.Size() == 0 {
		if _, err := ReadFile("/proc/self/status", 16); !errors.Is(err, ErrTooLarge) {
			t.Errorf("/proc/self/status with a 16-byte limit: %v", err)
		}
	}
}

// TestNamedPipeInManifest checks that a module or input that is a named
// pipe is refused, together with the manifest's other errors, instead of
// blocking Load until something writes to it.
func TestNamedPipeInManifest(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("named pipes")
	}
	dir := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(dir, "stage.wasm"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "input.bin"), 0o644); err != nil {
		t.Fatal(err)
	}
	src := `version = 1
[[device]]
name = "d"
backend = "sim"
engine = "gpu"
[[module]]
name = "m"
path = "stage.wasm"
sha256 = "376dd78101d7619e264b9b86af6604dd324cf0357b7bcc497f5d888c52a22f2b"
[[session]]
name = "s"
stage = "m"
device = "d"
input = "input.bin"
deadline = 5
`
	path := filepath.Join(dir, "host.toml")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	want := []string{
		path + ":8: module[0].path: " + strconv.Quote(filepath.Join(dir, "stage.wasm")) + " is not a regular file: it is a named pipe",
		path + ":14: session[0].input: " + strconv.Quote(filepath.Join(dir, "input.bin")) + " is not a regular file: it is a named pipe",
		path + ":15: session[0].deadline: must be a duration string",
	}
	if err == nil || strings.Count(err.Error(), "\n") != len(want)-1 {
		t.Fatalf("got %v", err)
	}
	for i, line := range strings.Split(err.Error(), "\n") {
		if !strings.HasPrefix(line, want[i]) {
			t.Errorf("error %d: %q, want it to start with %q", i, line, want[i])
		}
	}
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("class: %v", err)
	}
}

// TestManifestItselfIsChecked: the manifest, too, must be a regular file
// within MaxManifestSize.
func TestManifestItselfIsChecked(t *testing.T) {
	big := filepath.Join(t.TempDir(), "big.toml")
	if err := os.WriteFile(big, make([]byte, MaxManifestSize+1), 0o644); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		big:         big + ": file " + strconv.Quote(big) + " is larger than the manifest size limit of 4MiB",
		t.TempDir(): "is not a regular file: it is a directory",
	} {
		_, err := Load(path)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Load(%s): %v, want %q", path, err, want)
		}
	}
	if runtime.GOOS == "linux" {
		if _, err := Load("/dev/zero"); err == nil || !strings.Contains(err.Error(), "character device") {
			t.Errorf("Load(/dev/zero): %v", err)
		}
	}
}

// TestDecodeRefusesOversizeData: a ReadFunc that ignores its limit cannot
// hand Decode more than the limit.
func TestDecodeRefusesOversizeData(t *testing.T) {
	bin, err := os.ReadFile("testdata/modules/good_stage.wasm")
	if err != nil {
		t.Fatal(err)
	}
	src := `version = 1
[[device]]
name = "d"
backend = "sim"
engine = "gpu"
[[module]]
name = "m"
path = "m.wasm"
sha256 = "376dd78101d7619e264b9b86af6604dd324cf0357b7bcc497f5d888c52a22f2b"
max_size = "100B"
`
	var limits []int64
	_, err = Decode("host.toml", []byte(src), func(_ string, limit int64) ([]byte, error) {
		limits = append(limits, limit)
		return bin, nil
	})
	want := `host.toml:8: module[0].path: file "m.wasm" is larger than the module size limit of 100B (set by module[0].max_size)`
	if err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
	if len(limits) != 1 || limits[0] != 100 {
		t.Errorf("limits passed to the ReadFunc: %v", limits)
	}
}
