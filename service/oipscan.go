package service

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// A fast reader of the inference request's JSON: encoding/json's
// reflection costs about as much as the rest of an infer call. It reads
// the request as encoding/json would into oipRequest, and gives up
// (false) at anything it does not handle (a string with an escape, a
// parameter that is not a scalar, a nesting deeper than 64, malformed
// JSON); the caller then decodes with encoding/json, whose answer (and
// error message) stands. Unknown keys are skipped, as encoding/json
// does; a repeated key's last value wins, as there.

type jsonScan struct {
	b []byte
	i int
}

func (s *jsonScan) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek returns the next byte after white space, 0 at the end.
func (s *jsonScan) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *jsonScan) eat(c byte) bool {
	if s.peek() == c {
		s.i++
		return true
	}
	return false
}

// str reads a string without escapes or control characters.
func (s *jsonScan) str() (string, bool) {
	if !s.eat('"') {
		return "", false
	}
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			if !utf8.Valid(s.b[start:s.i]) {
				return "", false // encoding/json would replace the bad bytes
			}
			v := string(s.b[start:s.i])
			s.i++
			return v, true
		case c == '\\' || c < 0x20:
			return "", false
		}
		s.i++
	}
	return "", false
}

// number returns the bytes of a number of JSON's grammar.
func (s *jsonScan) number() ([]byte, bool) {
	s.ws()
	b, i := s.b, s.i
	start := i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	default:
		return nil, false
	}
	if i < len(b) && b[i] == '.' {
		i++
		d := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == d {
			return nil, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		d := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == d {
			return nil, false
		}
	}
	s.i = i
	return b[start:i], true
}

func (s *jsonScan) word(w string) bool {
	s.ws()
	if len(s.b)-s.i >= len(w) && string(s.b[s.i:s.i+len(w)]) == w {
		s.i += len(w)
		return true
	}
	return false
}

// skip passes over one value, checking it.
func (s *jsonScan) skip(depth int) bool {
	if depth > 64 {
		return false
	}
	switch s.peek() {
	case '"':
		s.i++
		for s.i < len(s.b) {
			c := s.b[s.i]
			s.i++
			switch {
			case c == '"':
				return true
			case c == '\\':
				if !s.escape() {
					return false
				}
			case c < 0x20:
				return false
			}
		}
		return false
	case '[':
		s.i++
		if s.eat(']') {
			return true
		}
		for {
			if !s.skip(depth + 1) {
				return false
			}
			if s.eat(']') {
				return true
			}
			if !s.eat(',') {
				return false
			}
		}
	case '{':
		s.i++
		if s.eat('}') {
			return true
		}
		for {
			if s.peek() != '"' || !s.skip(depth+1) || !s.eat(':') || !s.skip(depth+1) {
				return false
			}
			if s.eat('}') {
				return true
			}
			if !s.eat(',') {
				return false
			}
		}
	case 't':
		return s.word("true")
	case 'f':
		return s.word("false")
	case 'n':
		return s.word("null")
	}
	_, ok := s.number()
	return ok
}

// escape passes over the rest of an escape sequence after its
// backslash, checking it as JSON does: one of "\\/bfnrt, or u and four
// hexadecimal digits.
func (s *jsonScan) escape() bool {
	if s.i >= len(s.b) {
		return false
	}
	c := s.b[s.i]
	s.i++
	switch c {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return true
	case 'u':
		if len(s.b)-s.i < 4 {
			return false
		}
		for _, h := range s.b[s.i : s.i+4] {
			if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
				return false
			}
		}
		s.i += 4
		return true
	}
	return false
}

// object calls field for each key of an object; field reads the value.
func (s *jsonScan) object(field func(key string) bool) bool {
	if s.word("null") {
		return true
	}
	if !s.eat('{') {
		return false
	}
	if s.eat('}') {
		return true
	}
	for {
		k, ok := s.str()
		if !ok || !s.eat(':') || foldedKey(k) || !field(k) {
			return false
		}
		if s.eat('}') {
			return true
		}
		if !s.eat(',') {
			return false
		}
	}
}

// array calls elem for each element of an array (null: none).
func (s *jsonScan) array(elem func() bool) bool {
	if s.word("null") {
		return true
	}
	if !s.eat('[') {
		return false
	}
	if s.eat(']') {
		return true
	}
	for {
		if !elem() {
			return false
		}
		if s.eat(']') {
			return true
		}
		if !s.eat(',') {
			return false
		}
	}
}

// params reads an object of scalars as encoding/json would into a
// map[string]any: strings, float64s, bools.
func (s *jsonScan) params(dst *map[string]any) bool {
	if s.word("null") {
		*dst = nil
		return true
	}
	m := map[string]any{}
	ok := s.object(func(k string) bool {
		switch c := s.peek(); {
		case c == '"':
			v, ok := s.str()
			m[k] = v
			return ok
		case c == 't' || c == 'f':
			m[k] = c == 't'
			return s.word("true") || s.word("false")
		default:
			n, ok := s.number()
			if !ok {
				return false
			}
			f, err := strconv.ParseFloat(string(n), 64)
			m[k] = f
			return err == nil
		}
	})
	*dst = m
	return ok
}

func (s *jsonScan) shape(dst *[]int64) bool {
	if s.word("null") {
		*dst = nil
		return true
	}
	out := make([]int64, 0, 4)
	ok := s.array(func() bool {
		n, ok := s.number()
		if !ok {
			return false
		}
		v, err := strconv.ParseInt(string(n), 10, 64)
		out = append(out, v)
		return err == nil
	})
	*dst = out
	return ok
}

// scanInferRequest reads b into req; false: decode it with encoding/json.
func scanInferRequest(b []byte, req *oipRequest) bool {
	s := &jsonScan{b: b}
	ok := s.object(func(k string) bool {
		switch k {
		case "id":
			v, ok := s.str()
			req.ID = v
			return ok
		case "parameters":
			return s.params(&req.Parameters)
		case "inputs":
			req.Inputs = req.Inputs[:0]
			return s.array(func() bool {
				var in oipInput
				ok := s.object(func(k string) bool {
					switch k {
					case "name":
						v, ok := s.str()
						in.Name = v
						return ok
					case "datatype":
						v, ok := s.str()
						in.Datatype = v
						return ok
					case "shape":
						return s.shape(&in.Shape)
					case "parameters":
						return s.params(&in.Parameters)
					case "data":
						start := s.ws2()
						if !s.skip(0) {
							return false
						}
						in.Data = s.b[start:s.i]
						return true
					}
					return s.skip(0)
				})
				req.Inputs = append(req.Inputs, in)
				return ok
			})
		case "outputs":
			req.Outputs = req.Outputs[:0]
			return s.array(func() bool {
				var o oipOutputWant
				ok := s.object(func(k string) bool {
					switch k {
					case "name":
						v, ok := s.str()
						o.Name = v
						return ok
					case "parameters":
						return s.params(&o.Parameters)
					}
					return s.skip(0)
				})
				req.Outputs = append(req.Outputs, o)
				return ok
			})
		}
		return s.skip(0)
	})
	s.ws()
	return ok && s.i == len(b)
}

// foldedKey reports a key that encoding/json, which matches keys without
// regard to case, would take for one of the request's, written otherwise.
func foldedKey(k string) bool {
	for _, known := range [...]string{"id", "parameters", "inputs", "outputs", "name", "datatype", "shape", "data"} {
		if k != known && len(k) == len(known) && strings.EqualFold(k, known) {
			return true
		}
	}
	return false
}

// ws2 skips white space and returns the position.
func (s *jsonScan) ws2() int {
	s.ws()
	return s.i
}
