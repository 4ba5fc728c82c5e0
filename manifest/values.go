package manifest

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/internal/fileread"
)

// decoder walks the generic TOML tree against the schema, collecting
// every problem instead of stopping at the first.
type decoder struct {
	file        string
	dir         string
	readFile    ReadFunc
	idx         *lineIndex
	errs        []*Error
	badNames    map[string]bool // kinds of entry with a name that did not decode
	files       map[fileRead]readResult
	moduleLimit fileLimit // the limit of modules without their own max_size
	hashes      []ModuleHash
	moduleCount int // [[module]] tables seen
	// weightsAtUpload: LoadConfig.WithWeightsHashAtUpload.
	weightsAtUpload bool
}

// fileLimit is the most a file named by the manifest may hold, with what
// it is and where it comes from, for messages.
type fileLimit struct {
	size int64
	what string // "the module size limit"
	note string // " (set by runtime.max_module_size)", or ""
}

// inputLimit is the limit of session input files.
var inputLimit = fileLimit{MaxInputSize, "the input size limit", ""}

type fileRead struct {
	path  string
	limit int64
}

type readResult struct {
	data []byte
	err  error
}

// read reads a file through readFile, once per path and limit, and
// refuses more than the limit whatever readFile returned.
func (d *decoder) read(path string, limit fileLimit) ([]byte, error) {
	k := fileRead{path, limit.size}
	if r, ok := d.files[k]; ok {
		return r.data, r.err
	}
	data, err := d.readFile(path, limit.size)
	if err == nil && int64(len(data)) > limit.size {
		data, err = nil, &fs.PathError{Op: "read", Path: path, Err: ErrTooLarge}
	}
	if d.files == nil {
		d.files = map[fileRead]readResult{}
	}
	d.files[k] = readResult{data, err}
	return data, err
}

// fileError reports a file named at p that could not be read.
func (d *decoder) fileError(p keyPath, path string, limit fileLimit, err error) {
	d.errs = append(d.errs, readError(d.file, d.idx.line(p), p.String(), path, limit, err))
}

func (d *decoder) add(p keyPath, class error, msg string) {
	d.errs = append(d.errs, &Error{File: d.file, Line: d.idx.line(p), Key: p.String(), Msg: msg, class: class})
}

func (d *decoder) errorf(p keyPath, format string, args ...any) {
	d.add(p, errdefs.ErrInvalidArgument, fmt.Sprintf(format, args...))
}

// parse parses the TOML, reporting a syntax error at the parser's line
// with the key defined on that line, if any.
func (d *decoder) parse(data []byte) (map[string]any, bool) {
	if l := d.idx.deep; l > 0 {
		d.errs = append(d.errs, &Error{File: d.file, Line: l, Key: d.idx.keyAt(l), class: errdefs.ErrInvalidArgument,
			Msg: fmt.Sprintf("nested too deeply: a manifest needs at most %d levels of tables, arrays and dotted keys", maxDepth)})
		return nil, false
	}
	var raw map[string]any
	_, err := toml.Decode(string(data), &raw)
	if err == nil {
		return raw, true
	}
	e := &Error{File: d.file, Msg: err.Error(), class: errdefs.ErrInvalidArgument}
	var pe toml.ParseError
	if errors.As(err, &pe) {
		e.Line = pe.Position.Line
		e.Key = d.idx.keyAt(e.Line)
		e.Msg = "invalid TOML: " + pe.Message
	}
	// The parser's messages may show the input; they stay one printable
	// line like the others.
	e.Msg = escapeUnprintable(strings.ReplaceAll(e.Msg, "\n", " "))
	d.errs = append(d.errs, e)
	return nil, false
}

// table is one TOML table being decoded. Every key looked up is "known";
// finish reports the others.
type table struct {
	d     *decoder
	path  keyPath
	m     map[string]any
	known []string
	// moved maps keys that belong in a sub-table to where they belong,
	// for the unknown-key message.
	moved map[string]string
}

func (d *decoder) newTable(p keyPath, m map[string]any) *table {
	return &table{d: d, path: p, m: m}
}

// get looks key up, reporting it missing when required.
func (t *table) get(key string, required bool) (any, keyPath, bool) {
	t.known = append(t.known, key)
	p := t.path.key(key)
	v, ok := t.m[key]
	if !ok && required {
		t.d.errorf(p, "required key is missing")
	}
	return v, p, ok
}

// has reports whether key is present (and makes it known).
func (t *table) has(key string) bool {
	t.known = append(t.known, key)
	_, ok := t.m[key]
	return ok
}

// finish reports every key that was never looked up, each at its own line.
func (t *table) finish() {
	var unknown []string
	for k := range t.m {
		if !contains(t.known, k) {
			unknown = append(unknown, k)
		}
	}
	sort.Slice(unknown, func(i, j int) bool {
		li, lj := t.d.idx.line(t.path.key(unknown[i])), t.d.idx.line(t.path.key(unknown[j]))
		if li != lj {
			return li < lj
		}
		return unknown[i] < unknown[j]
	})
	for _, k := range unknown {
		msg := "unknown key"
		if where, ok := t.moved[k]; ok {
			msg += fmt.Sprintf(" (it belongs in %s)", where)
		} else if s := suggest(k, t.known); s != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", s)
		}
		t.d.errorf(t.path.key(k), "%s", msg)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// suggest returns the candidate closest to k, if one is close enough to
// be a likely typo: the same but for case, or one edit away (two for
// longer names), counting a swap of neighbours as one edit.
func suggest(k string, candidates []string) string {
	if len(candidates) > 256 {
		return "" // not worth the time: a manifest that large is generated
	}
	best, bestD := "", math.MaxInt
	for _, c := range candidates {
		d := editDistance(k, c)
		if strings.EqualFold(k, c) {
			d = 0
		}
		limit := 1
		if len(c) >= 8 {
			limit = 2
		}
		if d <= limit && d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the optimal string alignment distance between a and b:
// insertions, deletions, substitutions and swaps of neighbours.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return math.MaxInt32
	}
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// typeName names the TOML type of a decoded value, with an article.
func typeName(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case int64:
		return "an integer"
	case float64:
		return "a float"
	case bool:
		return "a boolean"
	case time.Time:
		return "a date-time"
	case []any:
		return "an array"
	case map[string]any:
		return "a table"
	case []map[string]any:
		return "an array of tables"
	}
	return fmt.Sprintf("a %T", v)
}

func (d *decoder) wrongType(p keyPath, want string, v any) {
	d.errorf(p, "must be %s, not %s", want, typeName(v))
}

// str decodes an optional string (def when absent). ok is false when the
// key is missing but required, or holds a bad value; both are reported.
func (t *table) str(key, def string, required bool) (string, bool) {
	v, p, present := t.get(key, required)
	if !present {
		return def, !required
	}
	s, ok := v.(string)
	if !ok {
		t.d.wrongType(p, "a string", v)
		return def, false
	}
	return s, true
}

// boolean decodes an optional boolean (def when absent).
func (t *table) boolean(key string, def bool) (bool, bool) {
	v, p, present := t.get(key, false)
	if !present {
		return def, true
	}
	b, ok := v.(bool)
	if !ok {
		t.d.wrongType(p, "a boolean", v)
		return def, false
	}
	return b, true
}

// name decodes a required, non-empty name.
func (t *table) name(key string) (string, bool) {
	s, ok := t.str(key, "", true)
	if ok && s == "" {
		t.d.errorf(t.path.key(key), "must not be empty")
		return "", false
	}
	return s, ok
}

// integer decodes an optional integer in [lo, hi].
func (t *table) integer(key string, def, lo, hi int64) (int64, bool) {
	v, p, present := t.get(key, false)
	if !present {
		return def, true
	}
	n, ok := v.(int64)
	if !ok {
		t.d.wrongType(p, "an integer", v)
		return def, false
	}
	return n, t.d.inRange(p, n, lo, hi, formatInt)
}

func formatInt(n int64) string { return strconv.FormatInt(n, 10) }

// fraction decodes an optional number in [0, 1]: a float, or the integer
// 0 or 1.
func (t *table) fraction(key string, def float64) (float64, bool) {
	v, p, present := t.get(key, false)
	if !present {
		return def, true
	}
	var f float64
	switch x := v.(type) {
	case float64:
		f = x
	case int64:
		f = float64(x)
	default:
		t.d.wrongType(p, "a number between 0 and 1", v)
		return def, false
	}
	if !(f >= 0 && f <= 1) {
		t.d.errorf(p, "must be between 0 and 1, not %v", v)
		return def, false
	}
	return f, true
}

// inRange reports n outside [lo, hi], formatting numbers with f.
func (d *decoder) inRange(p keyPath, n, lo, hi int64, f func(int64) string) bool {
	switch {
	case n >= lo && n <= hi:
		return true
	case hi == math.MaxInt64 || hi == math.MaxInt:
		d.errorf(p, "must be at least %s, not %s", f(lo), f(n))
	default:
		d.errorf(p, "must be between %s and %s, not %s", f(lo), f(hi), f(n))
	}
	return false
}

const sizeWant = `a size: an integer (bytes) or a string such as "64MiB"`

// size decodes an optional size in [lo, hi] bytes.
func (t *table) size(key string, def, lo, hi int64) (int64, bool) {
	v, p, present := t.get(key, false)
	if !present {
		return def, true
	}
	return t.d.sizeValue(p, v, lo, hi)
}

func (d *decoder) sizeValue(p keyPath, v any, lo, hi int64) (int64, bool) {
	var n int64
	switch x := v.(type) {
	case int64:
		if x < 0 {
			d.errorf(p, "a size must not be negative, got %d", x)
			return 0, false
		}
		n = x
	case string:
		var err error
		if n, err = ParseSize(x); err != nil {
			d.errorf(p, "%v", err)
			return 0, false
		}
	case float64:
		d.errorf(p, "a size must be a whole number of bytes, not a float (%v)", x)
		return 0, false
	default:
		d.wrongType(p, sizeWant, v)
		return 0, false
	}
	return n, d.inRange(p, n, lo, hi, FormatSize)
}

const durationWant = `a duration string such as "5s", "250ms" or "50us"`

// duration decodes an optional duration; positive asks for > 0, else >= 0.
func (t *table) duration(key string, def time.Duration, positive bool) (time.Duration, bool) {
	v, p, present := t.get(key, false)
	if !present {
		return def, true
	}
	s, ok := v.(string)
	if !ok {
		t.d.wrongType(p, durationWant, v)
		return def, false
	}
	dur, err := time.ParseDuration(s)
	switch {
	case err != nil:
		t.d.errorf(p, "not a duration: %q (write it like \"5s\", \"250ms\" or \"50us\")", s)
	case dur < 0:
		t.d.errorf(p, "must not be negative, got %s", dur)
	case dur == 0 && positive:
		t.d.errorf(p, "must be positive, got %q", s)
	default:
		return dur, true
	}
	return def, false
}

// strings decodes an optional array of strings; each bad element is
// reported at its own index.
func (t *table) strings(key string, def []string) ([]string, bool) {
	v, p, present := t.get(key, false)
	if !present {
		return def, true
	}
	arr, ok := v.([]any)
	if !ok {
		t.d.wrongType(p, "an array of strings", v)
		return def, false
	}
	out := make([]string, 0, len(arr))
	good := true
	for i, e := range arr {
		s, ok := e.(string)
		if !ok {
			t.d.wrongType(p.at(i), "a string", e)
			good = false
			continue
		}
		out = append(out, s)
	}
	return out, good
}

// sub decodes an optional sub-table; absent, it is an empty table (so
// defaults apply). It returns nil, reported, for a value of another type.
func (t *table) sub(key string) *table {
	v, p, present := t.get(key, false)
	if !present {
		return t.d.newTable(p, nil)
	}
	m, ok := v.(map[string]any)
	if !ok {
		t.d.wrongType(p, fmt.Sprintf("a table ([%s])", p.header()), v)
		return nil
	}
	return t.d.newTable(p, m)
}

// tables decodes an optional array of tables, written as [[key]] or as an
// inline array of inline tables. Elements that are not tables are reported
// and skipped (their slot is nil).
func (t *table) tables(key string) ([]*table, bool) {
	v, p, present := t.get(key, false)
	if !present {
		return nil, true
	}
	switch x := v.(type) {
	case []map[string]any:
		out := make([]*table, len(x))
		for i, m := range x {
			out[i] = t.d.newTable(p.at(i), m)
		}
		return out, true
	case []any:
		out := make([]*table, len(x))
		good := true
		for i, e := range x {
			m, ok := e.(map[string]any)
			if !ok {
				t.d.wrongType(p.at(i), "a table", e)
				good = false
				continue
			}
			out[i] = t.d.newTable(p.at(i), m)
		}
		return out, good
	}
	t.d.wrongType(p, fmt.Sprintf("an array of tables ([[%s]])", p.header()), v)
	return nil, false
}

// Size units: decimal ones are powers of 1000, binary ones of 1024.
var sizeUnits = map[string]int64{
	"B":  1,
	"KB": 1000, "MB": 1000 * 1000, "GB": 1000 * 1000 * 1000,
	"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30,
}

// ParseSize parses a size string: a whole, non-negative number of bytes
// followed by a unit, one of B, KB, MB, GB (powers of 1000) or KiB, MiB,
// GiB (powers of 1024), with no space: "512B", "4KiB", "64MiB", "1GB".
//
// # Errors
//
// An error for a negative or fractional number, a missing or unknown unit,
// or a size that does not fit an int64.
func ParseSize(s string) (int64, error) {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	unit := s[i:]
	switch {
	case strings.HasPrefix(s, "-"):
		return 0, fmt.Errorf("a size must not be negative, got %q", s)
	case i == 0:
		return 0, fmt.Errorf("not a size: %q (write it like \"4KiB\", \"64MiB\" or as an integer number of bytes)", s)
	case strings.HasPrefix(unit, "."):
		return 0, fmt.Errorf("a size must be a whole number of bytes, got %q (write 1536KiB, not 1.5MiB)", s)
	case unit == "":
		return 0, fmt.Errorf("size %q has no unit: write %sB, or the integer %s", s, s, s)
	}
	mult, ok := sizeUnits[unit]
	if !ok {
		return 0, fmt.Errorf("unknown size unit %q in %q (use B, KB, MB, GB, KiB, MiB or GiB)", unit, s)
	}
	n, err := strconv.ParseInt(s[:i], 10, 64)
	if err != nil || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return n * mult, nil
}

// FormatSize formats n bytes with the largest binary unit that divides it
// exactly ("64MiB", "4160B"); [ParseSize] reads it back.
func FormatSize(n int64) string { return fileread.FormatSize(n) }
