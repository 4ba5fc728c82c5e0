package emu

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
)

// TestSharedCases runs guest-sdk/testdata/emucases.txt on this emulator:
// the table the Rust and C emulators and the host run (examples/wasm,
// TestSharedCasesOnTheHost), so that all four agree on every status,
// out-value, last error and outcome.
func TestSharedCases(t *testing.T) {
	b, err := os.ReadFile("../testdata/emucases.txt")
	if err != nil {
		t.Fatal(err)
	}
	type scase struct {
		name, outcome string
		line          int
		body          []string
		streams       []string
		buffers       [][2]string
		weights       [][3]string // name, hex, "safetensors" or ""
		programs      []string
		budget, limit int
		input, output []byte
		hasOut        bool
		fence         []string // the module fence's lines, if any
	}
	var cases []*scase
	var cur *scase
	for n, raw := range strings.Split(string(b), "\n") {
		l := strings.TrimSpace(raw)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		kw, rest, _ := strings.Cut(l, " ")
		rest = strings.TrimSpace(rest)
		if kw == "case" {
			cur = &scase{name: rest, line: n + 1, outcome: "ok"}
			continue
		}
		if cur == nil {
			t.Fatalf("line %d: %q outside a case", n+1, l)
		}
		switch kw {
		case "end":
			cases = append(cases, cur)
			cur = nil
		case "stream":
			cur.streams = append(cur.streams, rest)
		case "buffer":
			name, size, _ := strings.Cut(rest, " ")
			cur.buffers = append(cur.buffers, [2]string{name, size})
		case "program":
			cur.programs = append(cur.programs, rest)
		case "weights", "safetensors":
			name, data, _ := strings.Cut(rest, " ")
			cur.weights = append(cur.weights, [3]string{name, data, strings.TrimPrefix(kw, "weights")})
		case "budget":
			cur.budget, _ = strconv.Atoi(rest)
		case "outlimit":
			cur.limit, _ = strconv.Atoi(rest)
		case "input":
			cur.input, _ = hex.DecodeString(rest)
		case "outcome":
			cur.outcome = rest
		case "output":
			cur.output, _ = hex.DecodeString(rest)
			cur.hasOut = true
		case "call", "lasterr", "return":
			cur.body = append(cur.body, l)
		case "fence":
			cur.fence = append(cur.fence, rest)
		default:
			t.Fatalf("line %d: unknown item %q", n+1, kw)
		}
	}
	if len(cases) < 19 {
		t.Fatalf("only %d cases", len(cases))
	}
	for _, c := range cases {
		cfg := NewConfig()
		if c.budget > 0 {
			cfg = cfg.WithBudget(int64(c.budget))
		}
		if c.limit > 0 {
			cfg = cfg.WithOutputLimit(c.limit)
		}
		for _, w := range c.weights {
			data, err := hex.DecodeString(w[1])
			if err != nil {
				t.Fatalf("case %s: weights %s: %v", c.name, w[0], err)
			}
			if w[2] != "" {
				cfg = cfg.WithSafetensors(w[0], data)
			} else {
				cfg = cfg.WithWeights(w[0], data)
			}
		}
		var e *Emulator
		if c.fence != nil {
			lines := c.fence
			cfg = cfg.WithFence(func() error { return caseFence((*abiHost)(e), lines) })
		}
		e = New(cfg)
		for _, s := range c.streams {
			e.Stream(s)
		}
		for _, bd := range c.buffers {
			size, _ := strconv.Atoi(bd[1])
			e.Buffer(bd[0], size)
		}
		e.Programs(c.programs...)
		var code int32
		e.Stage("main", func(*stagehost.Call) error {
			ip := &interp{h: (*abiHost)(e), vars: map[string]uint64{}}
			for _, l := range c.body {
				if err := ip.line(l); err != nil {
					return &stagehost.Error{Op: l + ": " + err.Error(), Status: 99}
				}
			}
			code = ip.code
			if code != 0 {
				return &stagehost.Error{Op: "return", Status: stagehost.Status(code)}
			}
			return nil
		})
		out, err := e.Run("main", c.input)
		var ce *ClientError
		var fe *FaultError
		switch {
		case c.outcome == "ok":
			if err != nil || (c.hasOut && string(out) != string(c.output)) {
				t.Errorf("case %s (line %d): want ok, output %x; got %x, %v", c.name, c.line, c.output, out, err)
			}
		case c.outcome == "fault":
			if !errors.As(err, &fe) {
				t.Errorf("case %s (line %d): want a device fault, got %v", c.name, c.line, err)
			}
		case c.outcome == "quarantined":
			var qe *QuarantineError
			if !errors.As(err, &qe) || e.Quarantined() == nil {
				t.Errorf("case %s (line %d): want the session quarantined, got %v", c.name, c.line, err)
			}
		case strings.HasPrefix(c.outcome, "client "):
			want, _ := strconv.Atoi(strings.TrimPrefix(c.outcome, "client "))
			if !errors.As(err, &ce) || int(ce.Code) != want {
				t.Errorf("case %s (line %d): want client error %d, got %v", c.name, c.line, want, err)
			}
		default:
			t.Fatalf("case %s: unknown outcome %q", c.name, c.outcome)
		}
	}
}

// caseFence is a shared case's module fence: its lines run in order until
// one is not 0 (ok: 0; code N: N; sync NAME: stream_sync's status), and
// the status is returned as the fence export would return it.
func caseFence(h *abiHost, lines []string) error {
	for _, l := range lines {
		f := strings.Fields(l)
		var st int32
		switch {
		case f[0] == "ok":
		case f[0] == "code" && len(f) == 2:
			st = int32(u(f[1]))
		case f[0] == "sync" && len(f) == 2:
			var s uint64
			if s, st = h.StreamGet([]byte(f[1])); st == 0 {
				st = h.StreamSync(s)
			}
		default:
			st = 1
		}
		if st != 0 {
			return &stagehost.Error{Op: "fence", Status: stagehost.Status(st)}
		}
	}
	return nil
}

// interp runs the call lines of a shared case on the raw host functions.
type interp struct {
	h    *abiHost
	vars map[string]uint64
	code int32
}

type tok struct {
	s        string
	str, sub bool // a "string", a ~"substring"
}

func tokens(line string) ([]tok, error) {
	var out []tok
	for i := 0; i < len(line); {
		c := line[i]
		if c == ' ' || c == '\t' {
			i++
			continue
		}
		sub := c == '~' && i+1 < len(line) && line[i+1] == '"'
		if c == '"' || sub {
			if sub {
				i++
			}
			i++
			var b strings.Builder
			for ; ; i++ {
				if i >= len(line) {
					return nil, fmt.Errorf("unterminated string")
				}
				if line[i] == '"' {
					break
				}
				if line[i] == '\\' && i+1 < len(line) {
					i++
				}
				b.WriteByte(line[i])
			}
			i++
			out = append(out, tok{s: b.String(), str: !sub, sub: sub})
			continue
		}
		j := i
		for j < len(line) && line[j] != ' ' && line[j] != '\t' {
			j++
		}
		out = append(out, tok{s: line[i:j]})
		i = j
	}
	return out, nil
}

func (ip *interp) handle(s string) (uint64, error) {
	if s == "0" {
		return 0, nil
	}
	s, ok := strings.CutPrefix(s, "$")
	if !ok {
		return 0, fmt.Errorf("not a handle: %q", s)
	}
	name, op := s, ""
	if i := strings.IndexAny(s, "^!+"); i >= 0 {
		name, op = s[:i], s[i:]
	}
	h, ok := ip.vars[name]
	if !ok {
		return 0, fmt.Errorf("no handle $%s", name)
	}
	switch {
	case op == "":
		return h, nil
	case op == "^tag":
		return h ^ 1<<32, nil
	case strings.HasPrefix(op, "!kind="):
		k, err := strconv.ParseUint(op[6:], 10, 8)
		return h&^(0xff<<56) | k<<56, err
	case strings.HasPrefix(op, "+"):
		n, err := strconv.ParseUint(op[1:], 10, 32)
		return h + n, err
	}
	return 0, fmt.Errorf("bad handle expression $%s", s)
}

func u(s string) uint64 { v, _ := strconv.ParseUint(s, 10, 64); return v }

// record is one 24-byte argument record.
func (ip *interp) record(w string) ([]byte, error) {
	r := make([]byte, 24)
	inner := func(p string) ([]string, bool) {
		rest, ok := strings.CutPrefix(w, p)
		if !ok || !strings.HasSuffix(rest, ")") {
			return nil, false
		}
		return strings.Split(strings.TrimSuffix(rest, ")"), ","), true
	}
	if a, ok := inner("buf("); ok {
		h, err := ip.handle(a[0])
		length := uint32(0xFFFFFFFF)
		if a[2] != "end" {
			length = uint32(u(a[2]))
		}
		binary.LittleEndian.PutUint32(r[0:], 1)
		binary.LittleEndian.PutUint32(r[4:], uint32(u(a[1])))
		binary.LittleEndian.PutUint32(r[8:], length)
		binary.LittleEndian.PutUint64(r[16:], h)
		return r, err
	}
	if a, ok := inner("f32("); ok {
		f, err := strconv.ParseFloat(a[0], 32)
		binary.LittleEndian.PutUint64(r[16:], uint64(math.Float32bits(float32(f))))
		return r, err
	}
	if a, ok := inner("u64("); ok {
		binary.LittleEndian.PutUint64(r[16:], u(a[0]))
		return r, nil
	}
	if a, ok := inner("rec("); ok {
		for i := range 4 {
			binary.LittleEndian.PutUint32(r[4*i:], uint32(u(a[i])))
		}
		v := u(a[4])
		if strings.HasPrefix(a[4], "$") {
			var err error
			if v, err = ip.handle(a[4]); err != nil {
				return nil, err
			}
		}
		binary.LittleEndian.PutUint64(r[16:], v)
		return r, nil
	}
	v, err := strconv.ParseUint(w, 10, 64)
	binary.LittleEndian.PutUint64(r[16:], v)
	return r, err
}

func unhex(s string) []byte { b, _ := hex.DecodeString(strings.TrimPrefix(s, "hex:")); return b }

func (ip *interp) line(l string) error {
	toks, err := tokens(l)
	if err != nil {
		return err
	}
	switch toks[0].s {
	case "return":
		ip.code = int32(u(toks[1].s))
		return nil
	case "lasterr":
		buf := make([]byte, 4096)
		n, _ := ip.h.LastError(buf)
		got := string(buf[:n])
		if (toks[1].str && got != toks[1].s) || (toks[1].sub && !strings.Contains(got, toks[1].s)) {
			return fmt.Errorf("last error %q, want %q", got, toks[1].s)
		}
		return nil
	}
	arrow := 0
	for i, tk := range toks {
		if tk.s == "=>" && !tk.str {
			arrow = i
		}
	}
	f, a, want := toks[1].s, toks[2:arrow], toks[arrow+1:]
	h := func(i int) uint64 { v, e := ip.handle(a[i].s); err = errors.Join(err, e); return v }
	var st int32
	var num *uint32
	var data []byte
	var handle *uint64
	var text *string
	setU := func(v uint32) { num = &v }
	setH := func(v uint64) { handle = &v }
	switch f {
	case "input_size":
		var n uint32
		n, st = ip.h.InputSize()
		setU(n)
	case "input_read":
		buf := make([]byte, u(a[1].s))
		var n uint32
		n, st = ip.h.InputRead(uint32(u(a[0].s)), buf)
		data = buf[:n]
	case "output_write":
		st = ip.h.OutputWrite(unhex(a[0].s))
	case "entry_name":
		buf := make([]byte, u(a[0].s))
		var n uint32
		n, st = ip.h.EntryName(buf)
		if st == 0 {
			s := string(buf[:n])
			text = &s
		}
	case "error_set":
		st = ip.h.ErrorSet([]byte(a[0].s))
	case "log":
		st = ip.h.Log(int32(u(a[0].s)), []byte(a[1].s))
	case "stream_get", "buffer_get", "program_get":
		var v uint64
		switch f {
		case "stream_get":
			v, st = ip.h.StreamGet([]byte(a[0].s))
		case "buffer_get":
			v, st = ip.h.BufferGet([]byte(a[0].s))
		default:
			v, st = ip.h.ProgramGet([]byte(a[0].s))
		}
		setH(v)
	case "weights_get":
		var v uint64
		v, st = ip.h.WeightsGet([]byte(a[0].s))
		setH(v)
	case "tensor_get":
		rec := make([]byte, tensorRecordSize)
		st = ip.h.TensorGet([]byte(a[0].s), rec)
		setH(binary.LittleEndian.Uint64(rec))
		data = rec[8:]
	case "buffer_alloc":
		var v uint64
		v, st = ip.h.BufferAlloc(uint32(u(a[0].s)))
		setH(v)
	case "buffer_alloc_named":
		var v uint64
		v, st = ip.h.BufferAllocNamed([]byte(a[0].s), uint32(u(a[1].s)))
		setH(v)
	case "buffer_free":
		st = ip.h.BufferFree(h(0))
	case "buffer_size":
		var n uint32
		n, st = ip.h.BufferSize(h(0))
		setU(n)
	case "stream_write":
		st = ip.h.StreamWrite(h(0), h(1), uint32(u(a[2].s)), unhex(a[3].s))
	case "stream_read":
		buf := make([]byte, u(a[3].s))
		st = ip.h.StreamRead(h(0), h(1), uint32(u(a[2].s)), buf)
		data = buf
	case "stream_submit":
		var recs []byte
		for _, w := range a[2:] {
			r, e := ip.record(w.s)
			err = errors.Join(err, e)
			recs = append(recs, r...)
		}
		st = ip.h.StreamSubmit(h(0), h(1), recs, uint32(len(a)-2))
	case "stream_submit_batch":
		var cmds, args []byte
		count := 0
		for i := 1; i < len(a); {
			p, e := ip.handle(a[i+1].s)
			err = errors.Join(err, e)
			ptr := len(args)
			n := 0
			for i += 2; a[i].s != "}"; i++ {
				r, e := ip.record(a[i].s)
				err = errors.Join(err, e)
				args = append(args, r...)
				n++
			}
			i++
			cmds = binary.LittleEndian.AppendUint64(cmds, p)
			cmds = binary.LittleEndian.AppendUint32(cmds, uint32(ptr))
			cmds = binary.LittleEndian.AppendUint32(cmds, uint32(n))
			count++
		}
		st = ip.h.StreamSubmitBatch(h(0), cmds, args, uint32(count))
	case "stream_sync":
		st = ip.h.StreamSync(h(0))
	case "stream_idle":
		var v uint32
		v, st = ip.h.StreamIdle(h(0))
		setU(v)
	default:
		return fmt.Errorf("unknown function %q", f)
	}
	if err != nil {
		return err
	}
	if name := stagehost.Status(st).String(); name != want[0].s {
		buf := make([]byte, 4096)
		n, _ := ip.h.LastError(buf)
		return fmt.Errorf("status %s, want %s (last error %q)", name, want[0].s, buf[:n])
	}
	for _, r := range want[1:] {
		if err := ip.result(r, text, handle, data, num); err != nil {
			return err
		}
	}
	return nil
}

// result checks one RESULT of a call (or binds its handle).
func (ip *interp) result(r tok, text *string, handle *uint64, data []byte, num *uint32) error {
	switch {
	case r.str:
		if text == nil || *text != r.s {
			return fmt.Errorf("wrote %v, want %q", text, r.s)
		}
	case strings.HasPrefix(r.s, "$"):
		ip.vars[r.s[1:]] = *handle
	case strings.HasPrefix(r.s, "hex:"):
		if hex.EncodeToString(data) != r.s[4:] {
			return fmt.Errorf("read %x, want %s", data, r.s[4:])
		}
	default:
		if num == nil || uint64(*num) != u(r.s) {
			return fmt.Errorf("wrote %v, want %s", num, r.s)
		}
	}
	return nil
}
