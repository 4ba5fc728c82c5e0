// Package fileread reads the files a host is told to read (a manifest and
// what it names, a model state, a cached cubin) with a bound: never more
// than a limit, never blocking on a named pipe, and never anything but a
// regular file. Package manifest exports the same functions
// (manifest.ReadFile, manifest.OpenFile) for its callers; the packages
// below manifest call these.
package fileread

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"strconv"
)

// ErrNotRegular is wrapped by the error [ReadFile] and [OpenFile] return
// for a path that is not a regular file: a directory, a device such as
// /dev/zero, a named pipe or a socket.
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge is wrapped by the error [ReadFile] returns for a file larger
// than its limit.
var ErrTooLarge = errors.New("file too large")

// ReadFile reads the regular file at path, refusing it if it holds more
// than limit bytes. It never blocks on a named pipe and never reads more
// than limit+1 bytes, whatever the file claims to hold: it opens the file
// without waiting for a writer, checks the open file's type, and then
// reads at most one byte past the limit.
//
//	bin, err := fileread.ReadFile("stage.wasm", 64<<20)
//
// # Errors
//
// An [*fs.PathError] wrapping [fs.ErrNotExist] when there is no such file,
// [ErrNotRegular] when it is not a regular file, [ErrTooLarge] when it
// holds more than limit bytes ("more than 64MiB", the limit as
// [FormatSize] writes it), or the error of the file system.
func ReadFile(path string, limit int64) ([]byte, error) {
	f, fi, err := OpenFile(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if limit < 0 {
		limit = 0
	}
	tooLarge := &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("%w: more than %s", ErrTooLarge, FormatSize(limit))}
	if fi.Size() > limit {
		return nil, tooLarge
	}
	// The size stat reports is a hint (a file may grow, or report 0): read
	// at most one byte past the limit to tell.
	data, err := io.ReadAll(io.LimitReader(f, min(limit, math.MaxInt64-1)+1))
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: path, Err: err}
	}
	if int64(len(data)) > limit {
		return nil, tooLarge
	}
	return data, nil
}

// OpenFile opens the regular file at path for reading, as [ReadFile]
// does: without waiting for a writer of a named pipe, and refusing
// anything that is not a regular file. It is for the files read as a
// stream, whose size the caller bounds.
//
// # Errors
//
// An [*fs.PathError] wrapping [fs.ErrNotExist] when there is no such file,
// [ErrNotRegular] when it is not a regular file, or the error of the file
// system.
func OpenFile(path string) (*os.File, fs.FileInfo, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|openNonBlock, 0)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, nil, &fs.PathError{Op: "read", Path: path, Err: &NotRegularError{fileKind(fi.Mode())}}
	}
	return f, fi, nil
}

// FormatSize writes a byte count as the manifest does: in the largest
// unit of GiB, MiB and KiB that divides it ("64MiB"), else in bytes
// ("1000B").
func FormatSize(n int64) string {
	for _, u := range []struct {
		name string
		size int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.size && n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

// NotRegularError says what a file that is not regular is ("a named
// pipe"); it is [ErrNotRegular] for errors.Is.
type NotRegularError struct{ Kind string }

func (e *NotRegularError) Error() string { return ErrNotRegular.Error() + ": it is " + e.Kind }

// Is reports whether target is [ErrNotRegular].
func (e *NotRegularError) Is(target error) bool { return target == ErrNotRegular }

// fileKind names what a file that is not regular is, for messages.
func fileKind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	}
	return fmt.Sprintf("of type %v", m.Type())
}
