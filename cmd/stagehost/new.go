package main

import (
	"embed"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	sdk "github.com/stagehost/stagehost/guest-sdk"
)

func init() { commands["new"] = true }

// exitCantCreate is the exit code of new when it cannot write the project:
// NAME exists and is not an empty directory, or a file cannot be written
// (sysexits EX_CANTCREAT).
const exitCantCreate = 73

// scaffold holds the templates of new projects: go/, c/ and rust/ for
// each language, and the files they share. In a template, {{name}} is the
// project's name; see newProject for the others.
//
//go:embed scaffold
var scaffold embed.FS

// sdkDir is where a Go or Rust project gets the SDK's sources, cHeader
// where a C project gets stagehost.h, and cEmu its emulator.
const (
	sdkDir  = "stagehost-sdk"
	cHeader = "include/stagehost.h"
	cEmu    = "emu.c"
)

// renamed maps a template's name (without .tmpl) to its path in a project,
// where they differ.
var renamed = map[string]string{"lib.rs": "src/lib.rs", "gitignore": ".gitignore"}

// languages are new's languages, and what each project is.
var languages = map[string]string{"go": "a Go stage", "c": "a C stage", "rust": "a Rust stage"}

// validName is what NAME's last element may be: a manifest name (module
// and session) and a Go module path, and a file name on every system.
var validName = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,63}$`)

const newAbout = `Write a new guest project in the directory NAME: a stage in Go, C or Rust
that uploads its input (float32 values x), runs the kernels fill and
saxpy on stream s0 to compute 2x + 1, and outputs the result; unit tests
of it on the SDK's emulator; build.sh, which builds NAME.wasm and writes
its sha256 into the manifests; host.toml (the sim backend) and cuda.toml
(the first NVIDIA GPU); input.bin; and a README with every command.
Everything builds with no network access:
  go    the SDK's sources in NAME/stagehost-sdk (its go.mod replaces the
        unpublished SDK module with them); go test ./...
  c     include/stagehost.h, and emu.c, the emulator, for test.sh
  rust  the Rust SDK's crate in NAME/stagehost-sdk (a path dependency);
        test.sh (cargo test) and build.sh use Debian's /usr/bin/rustc
        and cargo when present (RUSTC and CARGO pick others)

NAME is a directory; its last element must be lowercase letters, digits,
_ and -, starting with a letter. NAME must not exist, or be an empty
directory. Exits 73 (EX_CANTCREAT) when NAME exists and is not an empty
directory or a file cannot be written.

See docs/guest.md for the whole path from here to a stage on a GPU.`

// cmdNew writes a new guest project.
func cmdNew(args []string, stdout, stderr io.Writer) int {
	c := newCommand("new", "go|c|rust NAME", newAbout)
	c.fs.SetOutput(stderr)
	var pos []string
	for len(args) > 0 { // flags may come before, between or after the arguments
		if err := c.fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				c.printUsage(stdout)
				return exitOK
			}
			fmt.Fprintln(stderr)
			c.printUsage(stderr)
			return exitUsage
		}
		args = c.fs.Args()
		if len(args) > 0 {
			pos = append(pos, args[0])
			args = args[1:]
		}
	}
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "stagehost new: "+format+"\n\n", a...)
		c.printUsage(stderr)
		return exitUsage
	}
	if len(pos) != 2 {
		return bad("want a language (go, c or rust) and a NAME, got %d arguments", len(pos))
	}
	lang, dir := pos[0], pos[1]
	if languages[lang] == "" {
		return bad("unknown language %q: want go, c or rust", lang)
	}
	name := filepath.Base(filepath.Clean(dir))
	if !validName.MatchString(name) {
		return bad("bad NAME %q: its last element %q must be 1 to 64 lowercase letters, digits, _ and -, starting with a letter", dir, name)
	}
	files, err := newProject(lang, name)
	if err != nil {
		fmt.Fprintf(stderr, "stagehost new: %v\n", err) // a broken build: the templates are embedded
		return exitStartup
	}
	if err := writeProject(dir, files); err != nil {
		fmt.Fprintf(stderr, "stagehost new: %v\n", err)
		return exitCantCreate
	}
	fmt.Fprintf(stdout, "created %s: %s (see %s)\n\nNext:\n  cd %s\n",
		dir, languages[lang], filepath.Join(dir, "README.md"), dir)
	if lang == "go" {
		fmt.Fprintf(stdout, "  go test ./...               # the stage on the SDK's emulator\n")
	} else {
		fmt.Fprintf(stdout, "  ./test.sh                   # the stage on the SDK's emulator\n")
	}
	fmt.Fprintf(stdout, "  ./build.sh                  # %s.wasm, and its sha256 in the manifests\n", name)
	fmt.Fprintf(stdout, "  stagehost run host.toml     # on the simulated backend\n")
	fmt.Fprintf(stdout, "  stagehost run cuda.toml     # on the first NVIDIA GPU\n")
	return exitOK
}

// projectFile is one file of a new project.
type projectFile struct {
	path string // slash-separated, relative to the project
	data []byte
	exec bool
}

// newProject returns the files of a new project in lang ("go", "c" or
// "rust") named name.
func newProject(lang, name string) ([]projectFile, error) {
	read := func(p string) (string, error) {
		b, err := scaffold.ReadFile(p)
		return string(b), err
	}
	module, err := read("scaffold/module.toml.tmpl")
	if err != nil {
		return nil, err
	}
	if lang == "go" {
		module += "wasi = [\"go-runtime\"]   # the WASI functions the Go runtime imports\n"
	}
	sha, err := read("scaffold/sha256.sh.tmpl")
	if err != nil {
		return nil, err
	}
	goVersion, err := sdkGoVersion()
	if err != nil {
		return nil, err
	}
	// module and sha256 are expanded first: they hold {{name}}.
	r := strings.NewReplacer("{{module}}", module, "{{sha256}}", strings.TrimSuffix(sha, "\n"))
	// {{name_}} is the name of the crate's artefacts: cargo writes - as _.
	names := strings.NewReplacer("{{name}}", name, "{{name_}}", strings.ReplaceAll(name, "-", "_"), "{{go}}", goVersion)
	expand := func(s string) []byte { return []byte(names.Replace(r.Replace(s))) }

	var files []projectFile
	for _, dir := range []string{"scaffold", "scaffold/" + lang} {
		entries, err := scaffold.ReadDir(dir)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			n, ok := strings.CutSuffix(e.Name(), ".tmpl")
			if e.IsDir() || !ok || n == "module.toml" || n == "sha256.sh" {
				continue
			}
			s, err := read(dir + "/" + e.Name())
			if err != nil {
				return nil, err
			}
			p := n
			if r, ok := renamed[n]; ok {
				p = r
			}
			files = append(files, projectFile{path: p, data: expand(s), exec: strings.HasSuffix(n, ".sh")})
		}
	}
	files = append(files, projectFile{path: "input.bin", data: f32LE(1, 2, 3, 4)})

	switch lang {
	case "go":
		err = fs.WalkDir(sdk.Sources, ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			// Tests stay behind (they are the SDK's, and large); so does
			// the file that embeds the sources, whose patterns would then
			// match nothing.
			if strings.HasSuffix(p, "_test.go") || p == "sources.go" {
				return nil
			}
			b, err := sdk.Sources.ReadFile(p)
			files = append(files, projectFile{path: path.Join(sdkDir, p), data: b})
			return err
		})
	case "c":
		for _, f := range [][2]string{{"c/stagehost.h", cHeader}, {"c/emu.c", cEmu}} {
			b, rerr := sdk.Sources.ReadFile(f[0])
			err = errors.Join(err, rerr)
			files = append(files, projectFile{path: f[1], data: b})
		}
	case "rust":
		err = fs.WalkDir(sdk.RustSources, "rust", func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := sdk.RustSources.ReadFile(p)
			files = append(files, projectFile{path: path.Join(sdkDir, strings.TrimPrefix(p, "rust/")), data: b})
			return err
		})
	}
	if err != nil {
		return nil, err
	}
	return files, nil
}

// sdkGoVersion is the go directive of the SDK's go.mod, which a Go
// project's go.mod repeats.
func sdkGoVersion() (string, error) {
	b, err := sdk.Sources.ReadFile("go.mod")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "go "); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", errors.New("the embedded guest-sdk/go.mod has no go directive")
}

// f32LE encodes values as little-endian float32.
func f32LE(values ...float32) []byte {
	b := make([]byte, 0, 4*len(values))
	for _, v := range values {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

// writeProject creates dir (or uses it if it is an empty directory) and
// writes files into it. Every error names the path it is about.
func writeProject(dir string, files []projectFile) error {
	switch fi, err := os.Stat(dir); {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err // a *PathError: it names the path
		}
	case err != nil:
		return err
	case !fi.IsDir():
		return fmt.Errorf("%s already exists and is not a directory: choose another NAME", dir)
	default:
		entries, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		if len(entries) > 0 {
			return fmt.Errorf("%s already exists and is not empty: choose another NAME, or remove it", dir)
		}
	}
	for _, f := range files {
		p := filepath.Join(dir, filepath.FromSlash(f.path))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if f.exec {
			mode = 0o755
		}
		if err := os.WriteFile(p, f.data, mode); err != nil {
			return err
		}
	}
	return nil
}
