package stages

import (
	"bytes"
	"testing"
	"time"

	"github.com/stagehost/stagehost/internal/testutil"
)

// The output is appended to dst as the stage writes it: a dst with room
// for it gets the bytes in its own storage (no copy, no allocation), after
// the bytes dst already held.
func TestOutputLandsInDstsStorage(t *testing.T) {
	ctx := testutil.Context(t, time.Minute)
	f := newWasmFixture(t)
	s := f.session(t, f.mustLoad(t, "echo"), f.defaultConfig("echo"))
	in := make([]byte, 70_000) // three of echo's 32 KiB chunks
	for i := range in {
		in[i] = byte(i * 7)
	}
	dst := make([]byte, 3, 3+len(in))
	copy(dst, "abc")
	out, err := s.Run(ctx, in, dst)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out[:3], []byte("abc")) || !bytes.Equal(out[3:], in) {
		t.Fatal("output differs from dst's bytes followed by the input")
	}
	if &out[0] != &dst[:1][0] {
		t.Fatal("the output was not appended in dst's storage")
	}
	if cap(s.native.state.spare) != 0 {
		t.Fatal("the output was collected apart, then copied to dst")
	}
	if n := testing.AllocsPerRun(20, func() {
		if _, err := s.Run(ctx, in, dst[:3]); err != nil {
			t.Fatal(err)
		}
	}); n > 0 {
		t.Fatalf("a call into a dst with room allocated %v times", n)
	}
}

// A dst whose spare room holds the input the stage is reading (the
// caller's own buffer, reused) is not written while the stage runs: the
// output is the input all the same.
func TestOutputIntoDstOverlappingTheInput(t *testing.T) {
	ctx := testutil.Context(t, time.Minute)
	f := newWasmFixture(t)
	s := f.session(t, f.mustLoad(t, "echo"), f.defaultConfig("echo"))
	buf := make([]byte, 70_016)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	want := bytes.Clone(buf[:70_000])
	for range 2 { // the second call reuses the first one's output buffer
		copy(buf, want)
		out, err := s.Run(ctx, buf[:70_000], buf[16:16])
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out, want) {
			t.Fatal("the output is not the input: dst was written while the stage read the input")
		}
	}
}

// The output limit counts the stage's bytes, not those dst already held.
func TestOutputLimitCountsFromDstsLength(t *testing.T) {
	ctx := testutil.Context(t, time.Minute)
	f := newWasmFixture(t)
	s := f.session(t, f.mustLoad(t, "big_output"), f.defaultConfig("big").WithOutputLimit(64<<10))
	dst := bytes.Repeat([]byte{1}, 100)
	out, err := s.Run(ctx, nil, dst)
	if err != nil {
		t.Fatalf("64 KiB of output within a 64 KiB limit, after 100 bytes of dst: %v", err)
	}
	if len(out) != 100+64<<10 || !bytes.Equal(out[:100], dst) {
		t.Fatalf("got %d bytes", len(out))
	}
}
