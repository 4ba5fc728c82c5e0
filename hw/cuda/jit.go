package cuda

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/fileread"
)

// JIT of vendor PTX outside the serving path: a valid PTX can take tens
// of seconds to compile and blocks the thread that loads it (DESIGN.md,
// "Load-time checks"). The host compiles it in a child process, under a
// time limit, to a cubin, and caches the cubin by the sha256 of the PTX,
// the device's compute capability and the driver's version, as wazero
// caches compiled modules; a later load reads the cubin, which needs no
// JIT.

// JITSubcommand is the hidden stagehost subcommand that compiles PTX in
// a child process: `stagehost internal-jit -out FILE` reads the PTX on
// stdin, links it with cuLinkCreate/cuLinkAddData/cuLinkComplete for
// device 0 and writes the cubin to FILE. Its stderr is the JIT log.
const JITSubcommand = "internal-jit"

// JITConfig configures [CompilePTX].
type JITConfig struct {
	// Command is the child's command line, to which "-out FILE" is
	// appended: by default the running executable and [JITSubcommand].
	Command []string
	// CacheDir is where cubins are cached ("" for no cache).
	CacheDir string
	// Timeout bounds the child; 0 means [DefaultJITTimeout].
	Timeout time.Duration
	// ComputeCapability and DriverVersion key the cache, with the PTX.
	ComputeCapability string
	DriverVersion     int32
}

// DefaultJITTimeout is the default bound on compiling one PTX: 30 s.
const DefaultJITTimeout = 30 * time.Second

// JITCacheKey is the cache key of a cubin: the hex sha256 of the PTX,
// the compute capability and the driver version.
func JITCacheKey(ptx []byte, cc string, driver int32) string {
	h := sha256.New()
	h.Write(ptx)
	fmt.Fprintf(h, "\x00cc=%s\x00driver=%d", cc, driver)
	return hex.EncodeToString(h.Sum(nil))
}

// CompilePTX returns the cubin of ptx: from the cache when it holds one,
// else compiled by a child process (cfg.Command) that is killed when
// cfg.Timeout passes, then stored in the cache. name names the kernel in
// errors. cached reports a cache hit.
//
// # Errors
//
//   - [errdefs.ErrDeadlineExceeded]: the child ran past the timeout (it
//     was killed) or ctx ended.
//   - [errdefs.ErrInvalidArgument]: the child refused the PTX; its log
//     is included.
//   - [errdefs.ErrUnsupported]: the child could not be started.
func CompilePTX(ctx context.Context, cfg JITConfig, name string, ptx []byte) (cubin []byte, cached bool, err error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultJITTimeout
	}
	var path string
	if cfg.CacheDir != "" {
		path = filepath.Join(cfg.CacheDir, "cubin", JITCacheKey(ptx, cfg.ComputeCapability, cfg.DriverVersion)+".cubin")
		// A cached cubin over maxCubin is not used (compiled again).
		if b, err := fileread.ReadFile(path, maxCubin); err == nil && len(b) > 0 {
			return b, true, nil
		}
	}
	cmd := cfg.Command
	if len(cmd) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, false, errdefs.Errorf(errdefs.ErrUnsupported, "kernel %q: cannot start the JIT process: %v", name, err)
		}
		cmd = []string{exe, JITSubcommand}
	}
	// The child writes its cubin next to the cache (a rename then puts
	// it in place); a cache directory that is not there yet is made, and
	// one that cannot be made leaves the cubin in the system's temporary
	// directory, uncached.
	tmpDir := cfg.CacheDir
	if tmpDir != "" {
		if err := os.MkdirAll(tmpDir, 0o755); err != nil {
			tmpDir, path = "", ""
		}
	}
	tmp, err := os.CreateTemp(tmpDir, "jit-*.cubin")
	if err != nil {
		return nil, false, errdefs.Errorf(errdefs.ErrUnsupported, "kernel %q: %v", name, err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	cctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	c := exec.CommandContext(cctx, cmd[0], append(cmd[1:len(cmd):len(cmd)], "-out", tmp.Name())...)
	c.Stdin = bytes.NewReader(ptx)
	var stderr bytes.Buffer
	c.Stderr = &limitedWriter{w: &stderr, n: 64 << 10}
	c.WaitDelay = time.Second
	start := time.Now()
	runErr := c.Run()
	if cctx.Err() != nil {
		if ctx.Err() != nil {
			return nil, false, errdefs.ContextError(ctx, fmt.Sprintf("kernel %q: compiling its PTX", name))
		}
		return nil, false, errdefs.Errorf(errdefs.ErrDeadlineExceeded, "kernel %q: compiling its PTX took longer than its jit_timeout of %s: the JIT process was killed and the kernel refused", name, cfg.Timeout)
	}
	if runErr != nil {
		var ee *exec.ExitError
		if !errors.As(runErr, &ee) {
			return nil, false, errdefs.Errorf(errdefs.ErrUnsupported, "kernel %q: cannot run the JIT process: %v", name, runErr)
		}
		return nil, false, errdefs.Errorf(errdefs.ErrInvalidArgument, "kernel %q: the PTX does not compile (%s after %s): %s", name, ee.ProcessState, time.Since(start).Round(time.Millisecond), strings.TrimSpace(stderr.String()))
	}
	cubin, err = fileread.ReadFile(tmp.Name(), maxCubin)
	if errors.Is(err, fileread.ErrTooLarge) {
		return nil, false, errdefs.Errorf(errdefs.ErrInvalidArgument, "kernel %q: the JIT process wrote a cubin of more than %d bytes", name, maxCubin)
	}
	if err != nil || len(cubin) == 0 {
		return nil, false, errdefs.Errorf(errdefs.ErrInvalidArgument, "kernel %q: the JIT process wrote no cubin", name)
	}
	if path != "" {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err == nil {
			if err := os.Rename(tmp.Name(), path); err != nil {
				_ = os.WriteFile(path, cubin, 0o644)
			}
		}
	}
	return cubin, false, nil
}

// maxCubin bounds a cubin read back from the JIT process or the cache:
// far above what a kernel's PTX compiles to (a 100,000-line PTX gives a
// few MiB), so that a file there cannot make the process read without
// bound.
var maxCubin int64 = 256 << 20

type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if l.n > 0 {
		k := min(len(p), l.n)
		l.n -= k
		_, _ = l.w.Write(p[:k])
	}
	return len(p), nil
}
