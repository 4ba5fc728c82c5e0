package deploy

import (
	"fmt"
	"os"
	"strings"
)

// maxTokenFile bounds a token file.
const maxTokenFile = 64 << 10

// ReadTokens reads bearer tokens from a file (one per line; blank lines
// and lines starting with # are skipped) and from an environment variable
// (tokens separated by commas or white space). Either may be "".
//
// # Errors
//
// The file cannot be read or is larger than 64KiB; the variable is named
// but unset or empty; a token is shorter than 16 bytes.
func ReadTokens(file, env string) ([]string, error) {
	var toks []string
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("token file: %w", err)
		}
		if len(b) > maxTokenFile {
			return nil, fmt.Errorf("token file %s: larger than %d bytes", file, maxTokenFile)
		}
		for _, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			toks = append(toks, line)
		}
		if len(toks) == 0 {
			return nil, fmt.Errorf("token file %s holds no token", file)
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
