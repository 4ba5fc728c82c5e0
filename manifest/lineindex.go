package manifest

import (
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// elem is one element of a key path: a key, or an array index.
type elem struct {
	name    string
	index   int
	isIndex bool
}

// keyPath names a value in the manifest, such as session[1].buffer[0].size.
// Paths are built by appending to a copy, so they can be shared freely.
type keyPath []elem

func (p keyPath) key(name string) keyPath {
	return append(p[:len(p):len(p)], elem{name: name})
}

func (p keyPath) at(i int) keyPath {
	return append(p[:len(p):len(p)], elem{index: i, isIndex: true})
}

func (p keyPath) parent() keyPath { return p[:len(p)-1] }

// String formats the path the way messages show it: keys joined by dots,
// indices in brackets, and keys that are not bare TOML keys quoted.
func (p keyPath) String() string {
	var b strings.Builder
	for i, e := range p {
		switch {
		case e.isIndex:
			b.WriteByte('[')
			b.WriteString(strconv.Itoa(e.index))
			b.WriteByte(']')
		default:
			if i > 0 {
				b.WriteByte('.')
			}
			b.WriteString(formatKey(e.name))
		}
	}
	return b.String()
}

// header formats the path as a table header names it, without indices:
// session.buffer for session[1].buffer.
func (p keyPath) header() string {
	var names []string
	for _, e := range p {
		if !e.isIndex {
			names = append(names, formatKey(e.name))
		}
	}
	return strings.Join(names, ".")
}

// formatKey writes a key as TOML would accept it: bare if it can be, else
// quoted.
func formatKey(k string) string {
	if k == "" {
		return `""`
	}
	for i := 0; i < len(k); i++ {
		if !isBareKeyChar(k[i]) {
			return strconv.Quote(k)
		}
	}
	return k
}

func isBareKeyChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// lineEntry is one key path found in the source, with its 1-based line.
type lineEntry struct {
	path keyPath
	line int
}

// lineIndex maps the key paths of a TOML document to the lines that define
// them. BurntSushi/toml keeps key positions private, and it keys them by
// paths without array indices, so the manifest reads the lines itself.
//
// The index understands [table] and [[array]] headers (counting the
// elements of every array of tables under its own parent element), key =
// value lines, dotted and quoted keys, comments, all four string forms
// (multi-line ones included) and arrays and inline tables that span lines;
// array elements are indexed too (streams[1], fault[0].kind). It is a
// best-effort reader: on input that is not valid TOML it never fails and
// never panics, it skips to the next line and carries on.
type lineIndex struct {
	lines   map[string]int // path → line of its first definition
	entries []lineEntry    // every definition, in source order
	// deep is the first line that nests deeper than maxDepth (values in
	// values, or parts of one dotted key), 0 if none. Such input is never
	// handed to the TOML parser, whose cost grows faster than linearly
	// with nesting.
	deep int
}

// line returns the line of p or, if p itself is not in the source (a
// missing key, say), of its nearest ancestor; 0 if none is.
func (ix *lineIndex) line(p keyPath) int {
	for ; len(p) > 0; p = p.parent() {
		if l, ok := ix.lines[p.String()]; ok {
			return l
		}
	}
	return 0
}

// exact returns the line of p itself.
// keyAt returns the last path defined on line, or "".
func (ix *lineIndex) keyAt(line int) string {
	for i := len(ix.entries) - 1; i >= 0; i-- {
		if ix.entries[i].line == line {
			return ix.entries[i].path.String()
		}
	}
	return ""
}

// maxDepth bounds the nesting of arrays and inline tables, and the parts
// of one dotted key; deeper input ends the line as if malformed and sets
// lineIndex.deep. maxPath bounds the length of a recorded path (nested
// inline tables with dotted keys multiply).
const (
	maxDepth = 32
	maxPath  = 128
)

type indexer struct {
	src      string
	pos      int
	newlines []int // offsets of '\n'
	ix       *lineIndex
	counts   map[string]int // array-of-tables path → elements so far
}

func indexLines(src []byte) *lineIndex {
	s := &indexer{
		src:    string(src),
		ix:     &lineIndex{lines: map[string]int{}},
		counts: map[string]int{},
	}
	for i := 0; i < len(src); i++ {
		if src[i] == '\n' {
			s.newlines = append(s.newlines, i)
		}
	}
	s.run()
	return s.ix
}

// lineOf returns the 1-based line of byte offset off.
func (s *indexer) lineOf(off int) int {
	return sort.SearchInts(s.newlines, off) + 1
}

func (s *indexer) tooDeep() {
	if s.ix.deep == 0 {
		s.ix.deep = s.lineOf(s.pos)
	}
}

func (s *indexer) record(p keyPath, off int) {
	if len(p) > maxPath {
		s.tooDeep()
		return
	}
	line := s.lineOf(off)
	k := p.String()
	if _, ok := s.ix.lines[k]; !ok {
		s.ix.lines[k] = line
	}
	s.ix.entries = append(s.ix.entries, lineEntry{path: p, line: line})
}

func (s *indexer) eof() bool { return s.pos >= len(s.src) }

func (s *indexer) peek() byte {
	if s.eof() {
		return 0
	}
	return s.src[s.pos]
}

func (s *indexer) has(prefix string) bool { return strings.HasPrefix(s.src[s.pos:], prefix) }

// skipSpace skips spaces and tabs (and stray carriage returns).
func (s *indexer) skipSpace() {
	for !s.eof() {
		switch s.src[s.pos] {
		case ' ', '\t', '\r':
			s.pos++
		default:
			return
		}
	}
}

// skipLine moves past the next newline (or to the end).
func (s *indexer) skipLine() {
	if i := strings.IndexByte(s.src[s.pos:], '\n'); i >= 0 {
		s.pos += i + 1
	} else {
		s.pos = len(s.src)
	}
}

// skipBlank skips whitespace, newlines and comments.
func (s *indexer) skipBlank() {
	for !s.eof() {
		switch s.src[s.pos] {
		case ' ', '\t', '\r', '\n':
			s.pos++
		case '#':
			s.skipLine()
		default:
			return
		}
	}
}

// endOfLine accepts trailing whitespace and a comment; anything else is
// skipped as malformed.
func (s *indexer) endOfLine() {
	s.skipSpace()
	s.skipLine()
}

func (s *indexer) run() {
	var table keyPath
	for {
		s.skipBlank()
		if s.eof() {
			return
		}
		start := s.pos
		if s.peek() == '[' {
			array := s.has("[[")
			if array {
				s.pos += 2
			} else {
				s.pos++
			}
			keys, ok := s.keys()
			closing := "]"
			if array {
				closing = "]]"
			}
			s.skipSpace()
			if !ok || !s.has(closing) {
				s.skipLine()
				continue
			}
			s.pos += len(closing)
			table = s.header(keys, array, start)
			s.endOfLine()
			continue
		}
		keys, ok := s.keys()
		s.skipSpace()
		if !ok || s.peek() != '=' {
			s.skipLine()
			continue
		}
		s.pos++
		p := s.recordKeys(table, keys, start)
		s.skipSpace()
		if s.value(p, 0) {
			s.endOfLine()
		} else {
			s.skipLine()
		}
	}
}

// header resolves a table header to its indexed path and records it.
func (s *indexer) header(keys []string, array bool, off int) keyPath {
	var p keyPath
	for i, k := range keys {
		p = p.key(k)
		if array && i == len(keys)-1 {
			n := s.counts[p.String()]
			s.counts[p.String()] = n + 1
			s.record(p, off) // the array itself: device
			p = p.at(n)
		} else if n := s.counts[p.String()]; n > 0 {
			p = p.at(n - 1)
		}
		s.record(p, off)
	}
	return p
}

// recordKeys records a dotted key (each of its prefixes too) under base.
func (s *indexer) recordKeys(base keyPath, keys []string, off int) keyPath {
	p := base
	for _, k := range keys {
		p = p.key(k)
		s.record(p, off)
	}
	return p
}

// keys reads a dotted key: bare, "basic" or 'literal' parts joined by dots.
func (s *indexer) keys() ([]string, bool) {
	var keys []string
	for {
		s.skipSpace()
		k, ok := s.key()
		if !ok {
			return nil, false
		}
		keys = append(keys, k)
		if len(keys) > maxDepth {
			s.tooDeep()
			return nil, false
		}
		s.skipSpace()
		if s.peek() != '.' {
			return keys, true
		}
		s.pos++
	}
}

func (s *indexer) key() (string, bool) {
	switch s.peek() {
	case '"':
		return s.basicString()
	case '\'':
		s.pos++
		i := strings.IndexAny(s.src[s.pos:], "'\n")
		if i < 0 || s.src[s.pos+i] != '\'' {
			return "", false
		}
		k := s.src[s.pos : s.pos+i]
		s.pos += i + 1
		return k, true
	}
	start := s.pos
	for !s.eof() && isBareKeyChar(s.src[s.pos]) {
		s.pos++
	}
	return s.src[start:s.pos], s.pos > start
}

// basicString reads a one-line "basic" string at s.pos and decodes its
// escapes.
func (s *indexer) basicString() (string, bool) {
	s.pos++ // the opening quote
	var b strings.Builder
	for !s.eof() {
		c := s.src[s.pos]
		switch c {
		case '"':
			s.pos++
			return b.String(), true
		case '\n':
			return "", false
		case '\\':
			r, n, ok := unescape(s.src[s.pos:])
			if !ok {
				return "", false
			}
			b.WriteRune(r)
			s.pos += n
		default:
			b.WriteByte(c)
			s.pos++
		}
	}
	return "", false
}

// unescape decodes the escape at the start of s (which begins with a
// backslash), returning the rune and the bytes consumed.
func unescape(s string) (rune, int, bool) {
	if len(s) < 2 {
		return 0, 0, false
	}
	switch s[1] {
	case 'b':
		return '\b', 2, true
	case 't':
		return '\t', 2, true
	case 'n':
		return '\n', 2, true
	case 'f':
		return '\f', 2, true
	case 'r':
		return '\r', 2, true
	case 'e':
		return 0x1b, 2, true
	case '"':
		return '"', 2, true
	case '\\':
		return '\\', 2, true
	case 'x', 'u', 'U':
		n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[s[1]]
		if len(s) < 2+n {
			return 0, 0, false
		}
		v, err := strconv.ParseUint(s[2:2+n], 16, 32)
		if err != nil || !utf8.ValidRune(rune(v)) {
			return 0, 0, false
		}
		return rune(v), 2 + n, true
	}
	return 0, 0, false
}

// value skips the value at s.pos, recording the paths of array elements
// and inline-table keys under p. It reports false on malformed input.
func (s *indexer) value(p keyPath, depth int) bool {
	if depth > maxDepth {
		s.tooDeep()
		return false
	}
	switch {
	case s.has(`"""`):
		return s.multiline(`"""`, true)
	case s.has(`'''`):
		return s.multiline(`'''`, false)
	case s.peek() == '"':
		_, ok := s.basicString()
		return ok
	case s.peek() == '\'':
		_, ok := s.key()
		return ok
	case s.peek() == '[':
		return s.array(p, depth)
	case s.peek() == '{':
		return s.inlineTable(p, depth)
	}
	// A number, boolean or date-time: up to the next delimiter.
	start := s.pos
	for !s.eof() && !strings.ContainsRune(",]}#\n\r", rune(s.src[s.pos])) {
		s.pos++
	}
	return s.pos > start
}

// multiline skips a multi-line string opened by delim. In basic ones a
// backslash escapes the next byte (so \""" does not close the string).
func (s *indexer) multiline(delim string, escapes bool) bool {
	s.pos += 3
	for !s.eof() {
		switch {
		case escapes && s.src[s.pos] == '\\':
			s.pos += 2
		case s.has(delim):
			s.pos += 3
			// Up to two quotes right before the delimiter belong to the
			// string: """a"""""" is the string a"" .
			for n := 0; n < 2 && s.peek() == delim[0]; n++ {
				s.pos++
			}
			return true
		default:
			s.pos++
		}
	}
	s.pos = len(s.src)
	return false
}

func (s *indexer) array(p keyPath, depth int) bool {
	s.pos++ // [
	for i := 0; ; i++ {
		s.skipBlank()
		if s.eof() {
			return false
		}
		if s.peek() == ']' {
			s.pos++
			return true
		}
		s.record(p.at(i), s.pos)
		if !s.value(p.at(i), depth+1) {
			return false
		}
		s.skipBlank()
		switch s.peek() {
		case ',':
			s.pos++
		case ']':
			s.pos++
			return true
		default:
			return false
		}
	}
}

func (s *indexer) inlineTable(p keyPath, depth int) bool {
	s.pos++ // {
	for {
		s.skipBlank()
		if s.eof() {
			return false
		}
		if s.peek() == '}' {
			s.pos++
			return true
		}
		start := s.pos
		keys, ok := s.keys()
		s.skipSpace()
		if !ok || s.peek() != '=' {
			return false
		}
		s.pos++
		kp := s.recordKeys(p, keys, start)
		s.skipSpace()
		if !s.value(kp, depth+1) {
			return false
		}
		s.skipBlank()
		switch s.peek() {
		case ',':
			s.pos++
		case '}':
			s.pos++
			return true
		default:
			return false
		}
	}
}
