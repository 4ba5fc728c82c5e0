package deploy

import (
	"fmt"
	"os"
	"strings"

	"github.com/stagehost/stagehost/manifest"
)

// ReadTokens reads bearer tokens from a file (one per line; blank lines
// and lines starting with # are skipped; white space around a token is
// trimmed) and from an environment variable (tokens separated by commas
// or white space). Either may be "". The file is read with
// [manifest.ReadFile]: a regular file of at most
// [manifest.MaxTokenFileSize] bytes, never a device or a named pipe.
//
// # Errors
//
// The file cannot be read, is not a regular file or is larger than
// 64KiB (the error wraps [manifest.ErrNotRegular] or
// [manifest.ErrTooLarge]); a line holds white space inside its token
// (two tokens on one line: the error names the line, never the token);
// the file holds no token; the variable is named but unset or empty; a
// token is shorter than 16 bytes.
func ReadTokens(file, env string) ([]string, error) {
	var toks []string
	if file != "" {
		b, err := manifest.ReadFile(file, manifest.MaxTokenFileSize)
		if err != nil {
			return nil, err
		}
		for i, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if strings.ContainsAny(line, " \t\v\f\r") {
				return nil, fmt.Errorf("%s line %d: white space inside a token: put one token on each line", file, i+1)
			}
			toks = append(toks, line)
		}
		if len(toks) == 0 {
			return nil, fmt.Errorf("%s holds no token", file)
		}
	}
	if env != "" {
		v := os.Getenv(env)
		f := strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' })
		if len(f) == 0 {
			return nil, fmt.Errorf("token variable %s is unset or empty", env)
		}
		toks = append(toks, f...)
	}
	for _, t := range toks {
		if len(t) < 16 {
			return nil, fmt.Errorf("a token of %d bytes is too short: tokens must have at least 16", len(t))
		}
	}
	return toks, nil
}

// ReadCredentialFile reads a credential, key or certificate file that a
// configuration names (an nkey seed, a TLS CA, certificate or key) with
// [manifest.ReadFile]: a regular file of at most
// [manifest.MaxTLSFileSize] bytes, never a device or a named pipe, so a
// file swapped for one after the manifest was checked is refused, not
// waited on.
//
// # Errors
//
// Those of [manifest.ReadFile].
func ReadCredentialFile(path string) ([]byte, error) {
	return manifest.ReadFile(path, manifest.MaxTLSFileSize)
}
