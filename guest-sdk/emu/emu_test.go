package emu_test

import (
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
	"github.com/stagehost/stagehost/guest-sdk/emu"
)

func f32bytes(v ...float32) []byte {
	b := make([]byte, 0, 4*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

func floats(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

// run runs fn as the stage "main" of e and fails the test on a Run error.
func run(t *testing.T, e *emu.Emulator, fn func(c *stagehost.Call) error) []byte {
	t.Helper()
	out, err := e.Stage("main", fn).Run("main", nil)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func must[T any](t *testing.T) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func TestHandleLayout(t *testing.T) {
	e := emu.New(emu.NewConfig()).Stream("s0").Stream("s1").Buffer("w", 16).Programs("fill")
	run(t, e, func(c *stagehost.Call) error {
		s0 := must[stagehost.Stream](t)(c.Stream("s0"))
		w := must[stagehost.Buffer](t)(c.Buffer("w"))
		fill := must[stagehost.Program](t)(c.Program("fill"))
		a := must[stagehost.Buffer](t)(c.Alloc(8))
		for _, h := range []struct {
			h      uint64
			kind   uint64
			serial uint32
		}{{s0.Handle(), 1, 1}, {w.Handle(), 2, 2}, {fill.Handle(), 3, 3}, {a.Handle(), 2, 4}} {
			if h.h>>56 != h.kind || uint32(h.h) != h.serial {
				t.Errorf("handle %#x: want kind %d serial %d", h.h, h.kind, h.serial)
			}
			if uint32(h.h>>32)&(1<<24-1) != uint32(s0.Handle()>>32)&(1<<24-1) || (h.h>>32)&(1<<24-1) == 0 {
				t.Errorf("handle %#x: tag differs", h.h)
			}
		}
		// Looking up again gives the same handle; a new resource a new serial.
		if again := must[stagehost.Stream](t)(c.Stream("s0")); again != s0 {
			t.Errorf("second lookup: %#x", again.Handle())
		}
		if err := a.Free(); err != nil {
			t.Fatal(err)
		}
		b := must[stagehost.Buffer](t)(c.Alloc(8))
		if uint32(b.Handle()) != 5 {
			t.Errorf("serial reused or skipped: %#x", b.Handle())
		}
		s1 := must[stagehost.Stream](t)(c.Stream("s1"))
		if uint32(s1.Handle()) != 6 {
			t.Errorf("s1: %#x", s1.Handle())
		}
		return nil
	})
}

func TestHandleStatuses(t *testing.T) {
	var foreign stagehost.Buffer
	run(t, emu.New(emu.NewConfig()), func(c *stagehost.Call) error {
		foreign = must[stagehost.Buffer](t)(c.Alloc(16))
		return nil
	})
	e := emu.New(emu.NewConfig()).Stream("s0").Buffer("decl", 16).Programs("fill")
	run(t, e, func(c *stagehost.Call) error {
		s := must[stagehost.Stream](t)(c.Stream("s0"))
		fill := must[stagehost.Program](t)(c.Program("fill"))
		freed := must[stagehost.Buffer](t)(c.Alloc(16))
		if err := freed.Free(); err != nil {
			t.Fatal(err)
		}
		decl := must[stagehost.Buffer](t)(c.Buffer("decl"))
		var zero stagehost.Buffer
		for name, c := range map[string]struct {
			err  error
			want error
		}{
			"zero buffer size":          {second(zero.Size()), stagehost.ErrBadHandle},
			"zero stream sync":          {stagehost.Stream{}.Sync(), stagehost.ErrBadHandle},
			"stale size":                {second(freed.Size()), stagehost.ErrStaleHandle},
			"stale free":                {freed.Free(), stagehost.ErrStaleHandle},
			"stale write":               {s.Write(freed, 0, []byte{1}), stagehost.ErrStaleHandle},
			"stale arg":                 {s.Submit(fill, stagehost.Whole(freed), stagehost.F32(1)), stagehost.ErrStaleHandle},
			"foreign size":              {second(foreign.Size()), stagehost.ErrForeignHandle},
			"foreign arg":               {s.Submit(fill, stagehost.Whole(foreign), stagehost.F32(1)), stagehost.ErrForeignHandle},
			"free declared":             {decl.Free(), stagehost.ErrInvalidArgument},
			"write past end":            {s.Write(decl, 12, make([]byte, 8)), stagehost.ErrInvalidArgument},
			"read past end":             {s.Read(decl, 17, nil), stagehost.ErrInvalidArgument},
			"arg past end":              {s.Submit(fill, stagehost.Buf(decl, 8, 12), stagehost.F32(1)), stagehost.ErrInvalidArgument},
			"arg offset past end":       {s.Submit(fill, stagehost.Whole(decl), stagehost.Buf(decl, 20, 0)), stagehost.ErrInvalidArgument},
			"missing stream":            {second(c.Stream("nope")), stagehost.ErrNotFound},
			"missing buffer":            {second(c.Buffer("nope")), stagehost.ErrNotFound},
			"program not allowed":       {second(c.Program("relu")), stagehost.ErrNotFound},
			"alloc zero":                {second(c.Alloc(0)), stagehost.ErrInvalidArgument},
			"batch with a stale handle": {s.SubmitBatch(stagehost.Cmd(fill, stagehost.Whole(decl), stagehost.F32(1)), stagehost.Cmd(fill, stagehost.Whole(freed), stagehost.F32(1))), stagehost.ErrStaleHandle},
		} {
			if !errors.Is(c.err, c.want) {
				t.Errorf("%s: got %v, want %v", name, c.err, c.want)
			}
		}
		if n, err := decl.Size(); n != 16 || err != nil {
			t.Errorf("declared size: %d %v", n, err)
		}
		// Every failed submission above left nothing queued.
		if idle := must[bool](t)(s.Idle()); !idle {
			t.Error("a rejected command was enqueued")
		}
		// Edge ranges are fine.
		return errors.Join(
			s.Write(decl, 16, nil),
			s.Submit(fill, stagehost.Buf(decl, 16, 0), stagehost.F32(1)),
			s.Submit(fill, stagehost.Buf(decl, 4, stagehost.ToEnd), stagehost.F32(1)),
			s.Sync(),
		)
	})
}

func second[T any](_ T, err error) error { return err }

func TestBuiltinKernels(t *testing.T) {
	e := emu.New(emu.NewConfig()).Stream("s0").Programs(emu.Builtins()...)
	out := run(t, e, func(c *stagehost.Call) error {
		s := must[stagehost.Stream](t)(c.Stream("s0"))
		p := func(name string) stagehost.Program { return must[stagehost.Program](t)(c.Program(name)) }
		buf := must[stagehost.Buffer](t)(c.Alloc(4096))
		// Layout (floats): A 2x3 @0, B 3x2 @6, C 2x2 @12, bias 2 @16, x 4 @18, y 4 @22, argmax out @26.
		f := func(i int) int { return 4 * i }
		rng := func(i, n int) stagehost.Arg { return stagehost.Buf(buf, f(i), f(n)) }
		must[struct{}](t)(struct{}{}, errors.Join(
			s.Write(buf, f(0), f32bytes(1, 2, 3, 4, 5, 6)),
			s.Write(buf, f(6), f32bytes(7, 8, 9, 10, 11, 12)),
			s.Write(buf, f(16), f32bytes(0.5, -1000)),
			s.Submit(p("matmul"), rng(0, 6), rng(6, 6), rng(12, 4), stagehost.U32(2), stagehost.U32(2), stagehost.U32(3)),
			s.Submit(p("bias"), rng(12, 4), rng(16, 2), stagehost.U32(2), stagehost.U32(2)),
			s.Submit(p("relu"), rng(12, 4)),
			s.Submit(p("fill"), rng(18, 4), stagehost.F32(2)),
			s.Write(buf, f(22), f32bytes(1, 2, 3, 4)),
			s.Submit(p("saxpy"), stagehost.F32(0.5), rng(18, 4), rng(22, 4)),
			s.Submit(p("copy"), rng(18, 4), rng(22, 4)),
			s.Submit(p("noop"), stagehost.U32(1), stagehost.Whole(buf)),
			s.Submit(p("argmax"), rng(18, 4), rng(26, 2)),
			s.Sync(),
		))
		res := make([]byte, f(28))
		if err := s.Read(buf, 0, res); err != nil {
			return err
		}
		return c.Write(res)
	})
	v := floats(out)
	// C = A·B = [[58 64] [139 154]]; + bias [0.5 -1000]; relu.
	if got := v[12:16]; got[0] != 58.5 || got[1] != 0 || got[2] != 139.5 || got[3] != 0 {
		t.Errorf("matmul/bias/relu: %v", got)
	}
	if got := v[18:22]; got[0] != 2 || got[1] != 3 || got[2] != 4 || got[3] != 5 {
		t.Errorf("fill/saxpy/copy: %v", got)
	}
	if idx := binary.LittleEndian.Uint32(out[4*26:]); idx != 3 || v[27] != 5 {
		t.Errorf("argmax: %d %v", idx, v[27])
	}
}

func TestKernelFailuresReachSync(t *testing.T) {
	e := emu.New(emu.NewConfig()).Stream("s0").Programs("matmul", "fill", "argmax")
	_, err := e.Stage("main", func(c *stagehost.Call) error {
		s := must[stagehost.Stream](t)(c.Stream("s0"))
		mm := must[stagehost.Program](t)(c.Program("matmul"))
		fill := must[stagehost.Program](t)(c.Program("fill"))
		argmax := must[stagehost.Program](t)(c.Program("argmax"))
		b := must[stagehost.Buffer](t)(c.Alloc(64))
		for name, args := range map[string][]stagehost.Arg{
			"wrong count":     {stagehost.Whole(b)},
			"scalar for buf":  {stagehost.U32(1), stagehost.F32(1)},
			"misaligned":      {stagehost.Buf(b, 2, 8), stagehost.F32(1)},
			"odd length":      {stagehost.Buf(b, 0, 6), stagehost.F32(1)},
			"buffer for val":  {stagehost.Whole(b), stagehost.Whole(b)},
			"matmul mismatch": nil,
			"argmax short":    nil,
		} {
			var err error
			switch name {
			case "matmul mismatch":
				err = s.Submit(mm, stagehost.Buf(b, 0, 16), stagehost.Buf(b, 16, 16), stagehost.Buf(b, 32, 16), stagehost.U32(2), stagehost.U32(2), stagehost.U32(3))
			case "argmax short":
				err = s.Submit(argmax, stagehost.Buf(b, 0, 16), stagehost.Buf(b, 16, 4))
			default:
				err = s.Submit(fill, args...)
			}
			if err != nil {
				t.Fatalf("%s: submit: %v", name, err)
			}
			if err := s.Sync(); !errors.Is(err, stagehost.ErrFault) {
				t.Errorf("%s: sync: %v", name, err)
			}
		}
		// Each failure is reported once.
		if err := s.Sync(); err != nil {
			t.Errorf("second sync: %v", err)
		}
		// A read waits but leaves earlier failures to Sync.
		must[struct{}](t)(struct{}{}, s.Submit(fill, stagehost.Whole(b)))
		if err := s.Read(b, 0, make([]byte, 4)); err != nil {
			t.Errorf("read after a failed launch: %v", err)
		}
		if err := s.Sync(); !errors.Is(err, stagehost.ErrFault) {
			t.Errorf("sync after read: %v", err)
		}
		return nil
	}).Run("main", nil)
	// Every FAULT that Sync reported fails the run, although the stage
	// returned nil.
	var fe *emu.FaultError
	if !errors.As(err, &fe) || len(fe.Failures) != 8 || fe.Fence != nil || e.Quarantined() != nil {
		t.Errorf("run: %v", err)
	}
	var failures int
	for _, l := range e.Logs() {
		if l.Level == stagehost.LevelError && strings.HasPrefix(l.Message, "emu: stream \"s0\": command") {
			failures++
		}
	}
	if failures != 8 {
		t.Errorf("%d failures logged: %v", failures, e.Logs())
	}
}

func TestDeferredExecutionAndIdle(t *testing.T) {
	e := emu.New(emu.NewConfig()).Stream("s0").Buffer("b", 8).Programs("fill")
	run(t, e, func(c *stagehost.Call) error {
		s := must[stagehost.Stream](t)(c.Stream("s0"))
		b := must[stagehost.Buffer](t)(c.Buffer("b"))
		fill := must[stagehost.Program](t)(c.Program("fill"))
		data := f32bytes(1, 2)
		must[struct{}](t)(struct{}{}, s.Write(b, 0, data))
		data[0] = 0xFF // captured at the call
		must[struct{}](t)(struct{}{}, s.Submit(fill, stagehost.Whole(b), stagehost.F32(3)))
		if got, _ := e.Bytes("b"); !allZero(got) {
			t.Errorf("work ran before anything waited: %v", got)
		}
		if e.Pending("s0") != 2 {
			t.Errorf("pending %d", e.Pending("s0"))
		}
		polls := 0
		for {
			idle := must[bool](t)(s.Idle())
			if idle {
				break
			}
			polls++
		}
		if polls != 2 {
			t.Errorf("idle after %d polls", polls)
		}
		if got, _ := e.Bytes("b"); floats(got)[0] != 3 || floats(got)[1] != 3 {
			t.Errorf("after idle: %v", floats(got))
		}
		return nil
	})
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

func TestBatchValidatesAllFirst(t *testing.T) {
	e := emu.New(emu.NewConfig()).Stream("s0").Buffer("b", 16).Programs("fill", "relu")
	run(t, e, func(c *stagehost.Call) error {
		s := must[stagehost.Stream](t)(c.Stream("s0"))
		b := must[stagehost.Buffer](t)(c.Buffer("b"))
		fill := must[stagehost.Program](t)(c.Program("fill"))
		relu := must[stagehost.Program](t)(c.Program("relu"))
		err := s.SubmitBatch(
			stagehost.Cmd(fill, stagehost.Whole(b), stagehost.F32(-1)),
			stagehost.Cmd(relu, stagehost.Buf(b, 0, 20)),
		)
		if !errors.Is(err, stagehost.ErrInvalidArgument) || e.Pending("s0") != 0 {
			t.Errorf("bad batch: %v, %d pending", err, e.Pending("s0"))
		}
		err = s.SubmitBatch(
			stagehost.Cmd(fill, stagehost.Whole(b), stagehost.F32(-1)),
			stagehost.Cmd(fill, stagehost.Buf(b, 8, 8), stagehost.F32(2)),
			stagehost.Cmd(relu, stagehost.Whole(b)),
		)
		if err != nil || e.Pending("s0") != 3 {
			t.Fatalf("batch: %v, %d pending", err, e.Pending("s0"))
		}
		return s.Sync()
	})
	got, _ := e.Bytes("b")
	if v := floats(got); v[0] != 0 || v[1] != 0 || v[2] != 2 || v[3] != 2 {
		t.Errorf("%v", v)
	}
}

func TestBudget(t *testing.T) {
	e := emu.New(emu.NewConfig().WithBudget(100))
	run(t, e, func(c *stagehost.Call) error {
		a := must[stagehost.Buffer](t)(c.Alloc(60))
		if _, err := c.Alloc(41); !errors.Is(err, stagehost.ErrOutOfBudget) {
			t.Errorf("over budget: %v", err)
		}
		b := must[stagehost.Buffer](t)(c.Alloc(40))
		if e.BudgetUsed() != 100 {
			t.Errorf("used %d", e.BudgetUsed())
		}
		must[struct{}](t)(struct{}{}, errors.Join(a.Free(), b.Free()))
		return nil
	})
	if e.BudgetUsed() != 0 {
		t.Errorf("used %d after free", e.BudgetUsed())
	}
}

func TestInputOutput(t *testing.T) {
	e := emu.New(emu.NewConfig().WithOutputLimit(8))
	in := []byte("input bytes")
	out, err := e.Stage("io", func(c *stagehost.Call) error {
		if string(c.Input()) != "input bytes" || c.Entry() != "io" {
			t.Errorf("input %q entry %q", c.Input(), c.Entry())
		}
		if err := c.Write([]byte("12345")); err != nil {
			return err
		}
		if err := c.Write([]byte("6789")); !errors.Is(err, stagehost.ErrOutputTooLarge) || !errors.Is(err, stagehost.ErrOutOfBudget) {
			t.Errorf("over the limit: %v", err)
		}
		return c.Output([]byte("678"))
	}).Run("io", in)
	if err != nil || string(out) != "12345678" {
		t.Errorf("%q %v", out, err)
	}
	in[0] = 'X' // Run copied the input
	out, err = e.Run("io", []byte("input bytes"))
	if err != nil || string(out) != "12345678" {
		t.Errorf("second run: %q %v", out, err)
	}
}

func TestDefaultEntryAndLongEntry(t *testing.T) {
	long := strings.Repeat("x", 200)
	e := emu.New(emu.NewConfig()).
		Stage("main", func(c *stagehost.Call) error { return c.WriteString("main:" + c.Entry()) }).
		Stage(long, func(c *stagehost.Call) error { return c.WriteString(c.Entry()) })
	if out, err := e.Run("", nil); string(out) != "main:main" || err != nil {
		t.Errorf("%q %v", out, err)
	}
	if out, err := e.Run(long, nil); string(out) != long || err != nil {
		t.Errorf("long entry: %q %v", out, err)
	}
}

func TestClientErrorKeepsSession(t *testing.T) {
	e := emu.New(emu.NewConfig()).Stream("s0").Programs("noop")
	fail := true
	e.Stage("main", func(c *stagehost.Call) error {
		s := must[stagehost.Stream](t)(c.Stream("s0"))
		noop := must[stagehost.Program](t)(c.Program("noop"))
		if err := s.Submit(noop); err != nil {
			return err
		}
		if fail {
			return &stagehost.Error{Op: "decode", Status: stagehost.StatusNotFound}
		}
		return c.WriteString("ok")
	})
	_, err := e.Run("main", nil)
	var ce *emu.ClientError
	if !errors.As(err, &ce) || ce.Code != 5 || ce.Message != "stagehost: decode: NOT_FOUND" {
		t.Fatalf("%#v", err)
	}
	fail = false
	if out, err := e.Run("main", nil); string(out) != "ok" || err != nil {
		t.Errorf("after a client error: %q %v", out, err)
	}
	e.Stage("long", func(*stagehost.Call) error { return errors.New(strings.Repeat("m", 5000)) })
	_, err = e.Run("long", nil)
	if !errors.As(err, &ce) || ce.Code != 1 || len(ce.Message) != 4096 {
		t.Errorf("long message: code %d, %d bytes", ce.Code, len(ce.Message))
	}
}

func TestTrap(t *testing.T) {
	e := emu.New(emu.NewConfig()).Stream("s0").Programs("noop")
	e.Stage("main", func(c *stagehost.Call) error {
		s := must[stagehost.Stream](t)(c.Stream("s0"))
		_ = s.Submit(must[stagehost.Program](t)(c.Program("noop")))
		panic("boom")
	})
	_, err := e.Run("main", nil)
	var te *emu.TrapError
	if !errors.As(err, &te) || te.Value != "boom" || !errors.Is(err, stagehost.ErrFault) {
		t.Fatalf("%v", err)
	}
	// The built-in fence drained the stream: the session is fine.
	if e.Quarantined() != nil || e.Pending("s0") != 0 {
		t.Errorf("after a trap: %v, %d pending", e.Quarantined(), e.Pending("s0"))
	}
}

func TestFenceFailuresQuarantine(t *testing.T) {
	leave := func(c *stagehost.Call) error {
		s := must[stagehost.Stream](t)(c.Stream("s0"))
		return s.Submit(must[stagehost.Program](t)(c.Program("noop")))
	}
	for name, c := range map[string]struct {
		fence func() error
		stage func(*stagehost.Call) error
		want  string
	}{
		"lying fence":       {func() error { return nil }, leave, `stream "s0" still has 1 commands`},
		"failing fence":     {func() error { return errors.New("cannot drain") }, leave, "cannot drain"},
		"panicking fence":   {func() error { panic("fence boom") }, leave, "fence trapped"},
		"draining fence ok": {func() error { s, _ := stagehost.LookupStream("s0"); return s.Sync() }, leave, ""},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := emu.NewConfig()
			if c.fence != nil {
				cfg = cfg.WithFence(c.fence)
			}
			e := emu.New(cfg).Stream("s0").Programs("noop", "fill").Stage("main", c.stage)
			_, err := e.Run("main", nil)
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var q *emu.QuarantineError
			if !errors.As(err, &q) || !errors.Is(err, stagehost.ErrDeviceLost) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want a quarantine naming %q", err, c.want)
			}
			if e.Quarantined() == nil {
				t.Error("not quarantined")
			}
			if _, err2 := e.Run("main", nil); err2 != err {
				t.Errorf("later run: %v", err2)
			}
			if err := e.RunFence(); err != q {
				t.Errorf("later fence: %v", err)
			}
		})
	}
}

func TestReentrantRunIsBusy(t *testing.T) {
	e := emu.New(emu.NewConfig())
	e.Stage("main", func(c *stagehost.Call) error {
		_, err := e.Run("main", nil)
		if !errors.Is(err, stagehost.ErrBusy) {
			t.Errorf("nested run: %v", err)
		}
		return nil
	})
	if _, err := e.Run("main", nil); err != nil {
		t.Fatal(err)
	}
}

func TestLogs(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	e := emu.New(emu.NewConfig().WithLog(func(l stagehost.Level, msg string) {
		mu.Lock()
		seen = append(seen, l.String()+":"+msg)
		mu.Unlock()
	}))
	run(t, e, func(c *stagehost.Call) error {
		c.Log(stagehost.LevelWarn, "careful")
		stagehost.Log(stagehost.LevelDebug, "detail")
		stagehost.Log(stagehost.Level(9), "dropped: bad level")
		return nil
	})
	logs := e.Logs()
	if len(logs) != 2 || logs[0] != (emu.LogEntry{Level: stagehost.LevelWarn, Message: "careful"}) || logs[1].Message != "detail" {
		t.Errorf("%v", logs)
	}
	if len(seen) != 2 || seen[0] != "warn:careful" {
		t.Errorf("%v", seen)
	}
}

// Stages may use the SDK from several goroutines, and tests may run
// emulators in parallel.
func TestConcurrency(t *testing.T) {
	for i := range 4 {
		t.Run("", func(t *testing.T) {
			t.Parallel()
			e := emu.New(emu.NewConfig()).Stream("s0").Stream("s1").Programs("fill", "saxpy")
			out := run(t, e, func(c *stagehost.Call) error {
				var wg sync.WaitGroup
				errs := make([]error, 2)
				sums := make([]float32, 2)
				for j, name := range []string{"s0", "s1"} {
					wg.Go(func() {
						s, err := c.Stream(name)
						if err != nil {
							errs[j] = err
							return
						}
						fill, _ := c.Program("fill")
						b, err := c.Alloc(256)
						if err != nil {
							errs[j] = err
							return
						}
						for range 10 {
							if err := s.Submit(fill, stagehost.Whole(b), stagehost.F32(float32(i+j))); err != nil {
								errs[j] = err
								return
							}
						}
						res := make([]byte, 256)
						errs[j] = errors.Join(s.Sync(), s.Read(b, 0, res), b.Free())
						for _, v := range floats(res) {
							sums[j] += v
						}
					})
				}
				wg.Wait()
				if err := errors.Join(errs...); err != nil {
					return err
				}
				return c.Write(f32bytes(sums...))
			})
			if v := floats(out); v[0] != float32(64*i) || v[1] != float32(64*(i+1)) {
				t.Errorf("%v", v)
			}
		})
	}
}

func TestProgramsPanicsOnUnknownKernel(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "spin") {
			t.Errorf("%v", r)
		}
	}()
	emu.New(emu.NewConfig()).Programs("spin")
}

func TestCustomKernel(t *testing.T) {
	e := emu.New(emu.NewConfig()).Stream("s0").Buffer("b", 4).Kernel("inc", func(args []emu.Arg) error {
		if len(args) != 2 || !args[0].IsBuffer() || args[1].IsBuffer() {
			return errors.New("inc(buf, n)")
		}
		args[0].Bytes[0] += byte(args[1].Value)
		return nil
	})
	run(t, e, func(c *stagehost.Call) error {
		s := must[stagehost.Stream](t)(c.Stream("s0"))
		b := must[stagehost.Buffer](t)(c.Buffer("b"))
		inc := must[stagehost.Program](t)(c.Program("inc"))
		return errors.Join(s.Submit(inc, stagehost.Whole(b), stagehost.U32(5)), s.Sync())
	})
	if got, _ := e.Bytes("b"); got[0] != 5 {
		t.Errorf("%v", got)
	}
}

func TestAllocNamedFindsTheSameBufferAgain(t *testing.T) {
	e := emu.New(emu.NewConfig().WithBudget(1024))
	var first, second stagehost.Buffer
	run(t, e, func(c *stagehost.Call) error {
		var err error
		first, err = c.AllocNamed("w", 64)
		return err
	})
	run(t, e, func(c *stagehost.Call) error {
		var err error
		second, err = c.AllocNamed("w", 64)
		return err
	})
	if first != second || e.BudgetUsed() != 64 {
		t.Fatalf("named buffer allocated twice: %v %v, %d bytes used", first, second, e.BudgetUsed())
	}
	run(t, e, func(c *stagehost.Call) error {
		if _, err := c.AllocNamed("w", 32); !errors.Is(err, stagehost.ErrInvalidArgument) {
			t.Errorf("same name, other size: %v", err)
		}
		if _, err := c.AllocNamed("", 32); !errors.Is(err, stagehost.ErrInvalidArgument) {
			t.Errorf("empty name: %v", err)
		}
		if err := first.Free(); err != nil {
			return err
		}
		b, err := c.AllocNamed("w", 32) // the name is free again
		if err != nil || b == first {
			t.Errorf("after free: %v %v", b, err)
		}
		return err
	})
}
