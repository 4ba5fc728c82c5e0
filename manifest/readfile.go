package manifest

import (
	"io/fs"
	"os"

	"github.com/stagehost/stagehost/internal/fileread"
)

// Limits on the files a manifest names, and on the manifest itself.
const (
	// MaxManifestSize is the largest manifest [Load] reads.
	MaxManifestSize = 4 << 20
	// MaxInputSize is the largest input file a session may name, and the
	// default of a session's max_input: the bound the HTTP service puts on
	// a request's input.
	MaxInputSize = 64 << 20
	// MaxTokenFileSize is the largest token file (bearer tokens, a NATS
	// token or nkey seed) the manifest or a flag may name.
	MaxTokenFileSize = maxTokenFileSize
	// MaxTLSFileSize is the largest TLS certificate or key file the
	// manifest or a flag may name.
	MaxTLSFileSize = maxTLSFileSize
)

// ErrNotRegular is wrapped by the error [ReadFile] returns for a path that
// is not a regular file: a directory, a device such as /dev/zero, a named
// pipe or a socket.
var ErrNotRegular = fileread.ErrNotRegular

// ErrTooLarge is wrapped by the error [ReadFile] returns for a file larger
// than its limit.
var ErrTooLarge = fileread.ErrTooLarge

// ReadFunc reads the file at path, which must hold at most limit bytes.
// [ReadFile] is the one that reads the file system; [Decode] takes
// others, such as one serving files from memory. A ReadFunc should fail
// with an error wrapping [fs.ErrNotExist], [ErrNotRegular] or
// [ErrTooLarge] where those apply; [Decode] refuses data longer than
// limit whatever the error.
type ReadFunc func(path string, limit int64) ([]byte, error)

// ReadFile reads the regular file at path, refusing it if it holds more
// than limit bytes. It never blocks on a named pipe and never reads more
// than limit+1 bytes, whatever the file claims to hold: it opens the file
// without waiting for a writer, checks the open file's type, and then
// reads at most one byte past the limit.
//
//	bin, err := manifest.ReadFile("stage.wasm", 64<<20)
//
// # Errors
//
// An [*fs.PathError] wrapping [fs.ErrNotExist] when there is no such file,
// [ErrNotRegular] when it is not a regular file, [ErrTooLarge] when it
// holds more than limit bytes, or the error of the file system.
func ReadFile(path string, limit int64) ([]byte, error) { return fileread.ReadFile(path, limit) }

// OpenFile opens the regular file at path for reading, as [ReadFile]
// does: without waiting for a writer of a named pipe, and refusing
// anything that is not a regular file. It is for the files read as a
// stream (a module to upload, a trace), whose size the caller bounds.
//
//	f, fi, err := manifest.OpenFile("trace.json")
//
// # Errors
//
// An [*fs.PathError] wrapping [fs.ErrNotExist] when there is no such file,
// [ErrNotRegular] when it is not a regular file, or the error of the file
// system.
func OpenFile(path string) (*os.File, fs.FileInfo, error) { return fileread.OpenFile(path) }
