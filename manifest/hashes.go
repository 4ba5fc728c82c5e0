package manifest

import (
	"fmt"
	"path/filepath"

	"github.com/stagehost/stagehost/errdefs"
)

// ModuleHash is a module's file and its actual sha256, as [ModuleHashes]
// finds them.
type ModuleHash struct {
	Name     string // the module's name ("" if it did not decode)
	Key      string // the key path of its sha256: "module[0].sha256"
	Line     int    // the line of its sha256 key, or of its [[module]] table when the key is missing
	Path     string // the path as the manifest gives it
	File     string // the path resolved against the manifest's directory
	Declared string // the declared sha256 as written ("" when missing or empty)
	SHA256   string // the file's sha256, lower-case hex
}

// Matches reports whether the declared sha256 is the file's (in either
// case).
func (h ModuleHash) Matches() bool {
	return len(h.Declared) == len(h.SHA256) && equalFoldHex(h.Declared, h.SHA256)
}

func equalFoldHex(a, b string) bool {
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'F' {
			x += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// ModuleHashes reads the manifest at path and every module file it names,
// and returns each module's actual sha256, in the order of the manifest's
// [[module]] tables, whatever their declared sha256 says (missing, empty,
// malformed or stale) and whatever else is wrong with the manifest. It is
// for accepting a rebuilt module's hash during development (`stagehost
// check --print-sha256`); [Load] still refuses a manifest whose hashes do
// not match.
//
// # Errors
//
// An [*Errors] (every problem of the manifest, as [Load] reports them)
// when a module's file could not be read, or its path did not decode, so
// that it has no hash; the hashes found are still returned. Nothing else
// wrong with the manifest is an error here.
func ModuleHashes(path string) ([]ModuleHash, error) {
	data, err := ReadFile(path, MaxManifestSize)
	if err != nil {
		limit := fileLimit{MaxManifestSize, "the manifest size limit", ""}
		return nil, &Errors{List: []*Error{readError(path, 0, "", path, limit, err)}}
	}
	d := &decoder{file: path, dir: filepath.Dir(path), readFile: ReadFile, idx: indexLines(data)}
	m := d.decode(data)
	if m == nil || len(d.hashes) < d.moduleCount {
		if len(d.errs) == 0 { // cannot happen: a module without a hash has an error
			d.errs = append(d.errs, &Error{File: path, Msg: fmt.Sprintf("%d of %d modules have no file to hash", d.moduleCount-len(d.hashes), d.moduleCount), class: errdefs.ErrInvalidArgument})
		}
		return d.hashes, &Errors{List: sortErrors(d.errs)}
	}
	return d.hashes, nil
}
