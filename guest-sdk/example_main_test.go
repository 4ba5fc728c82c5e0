package stagehost_test

import (
	"encoding/binary"
	"fmt"
	"math"

	stagehost "github.com/stagehost/stagehost/guest-sdk"
	"github.com/stagehost/stagehost/guest-sdk/emu"
)

// A stage module registers its stage from an init function: built with
// GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared, package
// initialisation runs in _initialize and main is never called.
func init() {
	stagehost.Main(fillAndSum)
}

// fillAndSum fills a 16-float device buffer with the float32 in its input
// and returns the buffer's sum.
func fillAndSum(c *stagehost.Call) error {
	in := c.Input()
	if len(in) != 4 {
		return fmt.Errorf("want one float32, got %d bytes: %w", len(in), stagehost.ErrInvalidArgument)
	}
	s, err := c.Stream("s0")
	if err != nil {
		return err
	}
	fill, err := c.Program("fill")
	if err != nil {
		return err
	}
	buf, err := c.Alloc(64)
	if err != nil {
		return err
	}
	defer buf.Free()
	v := math.Float32frombits(binary.LittleEndian.Uint32(in))
	if err := s.Submit(fill, stagehost.Whole(buf), stagehost.F32(v)); err != nil {
		return err
	}
	if err := s.Sync(); err != nil {
		return err
	}
	var out [64]byte
	if err := s.Read(buf, 0, out[:]); err != nil {
		return err
	}
	var sum float32
	for i := 0; i < 64; i += 4 {
		sum += math.Float32frombits(binary.LittleEndian.Uint32(out[i:]))
	}
	c.Log(stagehost.LevelInfo, "filled")
	return c.Write(binary.LittleEndian.AppendUint32(nil, math.Float32bits(sum)))
}

// Natively, the emulator runs what init registered.
func ExampleMain() {
	e := emu.New(emu.NewConfig()).Stream("s0").Programs("fill")
	out, err := e.Run("main", binary.LittleEndian.AppendUint32(nil, math.Float32bits(2.5)))
	fmt.Println(math.Float32frombits(binary.LittleEndian.Uint32(out)), err)

	_, err = e.Run("main", []byte("bad"))
	fmt.Println(err)
	// Output:
	// 40 <nil>
	// emu: stage failed with code 4: want one float32, got 3 bytes: stagehost: INVALID_ARGUMENT
}
