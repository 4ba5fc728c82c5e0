// Command stage is the mlp example: a tiny MLP classifier (see package
// model) run on the session's device. Input: 8 float32 values,
// little-endian (32 bytes). Output: the class as a little-endian uint32,
// then the 4 float32 scores, little-endian (20 bytes).
//
// Each run uploads the input, runs the network on stream "s0", and reads
// the scores and the argmax back with one download, which is the call's
// only wait: the stream runs in order, so the download waits for the
// launches too. A Sync after it finds the stream idle (no wait) and
// reports a failed launch, as a Sync before the download did. The weights
// are uploaded once per instance.
//
// The network runs as one launch of the program mlp_forward when the
// session lists it (program_get finds it), else as the six-launch batch
// matmul → bias → relu → matmul → bias → argmax; both write the same bytes
// (mlp_forward does the same float32 operations in the same order), so
// manifests that list only the four older programs keep working.
//
// Build: GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o mlp.wasm .
package main

import (
	"encoding/binary"
	"errors"
	"strconv"

	"github.com/stagehost/stagehost/examples/wasm/mlp/model"
	stagehost "github.com/stagehost/stagehost/guest-sdk"
)

func init() { stagehost.Main(run) }

func main() {}

// Byte offsets in the work buffer: the input x (1×Inputs), the hidden layer
// h (1×Hidden; the six-launch path only), the scores (1×Classes), then
// argmax's 8-byte result right after the scores, so that one read fetches
// both.
const (
	offX      = 0
	offH      = offX + 4*model.Inputs
	offScores = offH + 4*model.Hidden
	offArgmax = offScores + 4*model.Classes
	workSize  = offArgmax + 8
	readLen   = workSize - offScores
)

// instance is what this Wasm instance knows about its session. Handles
// outlive an instance but Go globals do not: a replaced instance (after a
// trap) starts with inst == nil and looks everything up again. The stream
// handle identifies the session, so a cached instance for another session
// (possible only in native tests, where one process runs many emulated
// sessions) is detected too.
type instance struct {
	s0      stagehost.Stream
	weights stagehost.Buffer
	work    stagehost.Buffer
	batch   []stagehost.Command // the six-launch path, when fused is nil
	forward stagehost.Program   // mlp_forward, when fused is not nil
	fused   []stagehost.Arg
}

var inst *instance

func setup(c *stagehost.Call) (*instance, error) {
	s0, err := c.Stream("s0")
	if err != nil {
		return nil, err
	}
	if inst != nil && inst.s0 == s0 {
		return inst, nil
	}
	forward, err := c.Program("mlp_forward")
	fused := err == nil
	if err != nil && !errors.Is(err, stagehost.ErrNotFound) {
		return nil, &contextError{"mlp: program mlp_forward", err}
	}
	var progs [4]stagehost.Program
	if !fused {
		for i, name := range [...]string{"matmul", "bias", "relu", "argmax"} {
			if progs[i], err = c.Program(name); err != nil {
				return nil, &contextError{"mlp: program " + name, err}
			}
		}
	}
	matmul, bias, relu, argmax := progs[0], progs[1], progs[2], progs[3]

	// Named buffers: a replaced instance (after a trap) finds the same
	// buffers again instead of allocating new ones. The weights are written
	// again all the same, so they are right whatever the old instance did.
	weights, err := c.AllocNamed("mlp.weights", 4*model.NumParams)
	if err != nil {
		return nil, err
	}
	work, err := c.AllocNamed("mlp.work", workSize)
	if err != nil {
		return nil, err
	}
	if err := s0.Write(weights, 0, model.ParamBytes()); err != nil {
		return nil, err
	}
	f := func(off int) int { return 4 * off }
	w := func(off, n int) stagehost.Arg { return stagehost.Buf(weights, f(off), f(n)) }
	x := stagehost.Buf(work, offX, 4*model.Inputs)
	h := stagehost.Buf(work, offH, 4*model.Hidden)
	scores := stagehost.Buf(work, offScores, 4*model.Classes)
	out := stagehost.Buf(work, offArgmax, 8)
	u := stagehost.U32
	in, hid, cls := uint32(model.Inputs), uint32(model.Hidden), uint32(model.Classes)
	w1, b1 := w(model.OffW1, model.Inputs*model.Hidden), w(model.OffB1, model.Hidden)
	w2, b2 := w(model.OffW2, model.Hidden*model.Classes), w(model.OffB2, model.Classes)
	inst = &instance{s0: s0, weights: weights, work: work}
	if fused {
		// mlp_forward(x, W1, b1, W2, b2, scores, out, I, H, C)
		inst.forward = forward
		inst.fused = []stagehost.Arg{x, w1, b1, w2, b2, scores, out, u(in), u(hid), u(cls)}
	} else {
		inst.batch = []stagehost.Command{
			// matmul(A, B, C, M, N, K)
			stagehost.Cmd(matmul, x, w1, h, u(1), u(hid), u(in)),
			stagehost.Cmd(bias, h, b1, u(1), u(hid)),
			stagehost.Cmd(relu, h),
			stagehost.Cmd(matmul, h, w2, scores, u(1), u(cls), u(hid)),
			stagehost.Cmd(bias, scores, b2, u(1), u(cls)),
			stagehost.Cmd(argmax, scores, out),
		}
	}
	return inst, nil
}

func run(c *stagehost.Call) error {
	in := c.Input()
	if len(in) != model.InputSize {
		return &inputError{len(in)}
	}
	st, err := setup(c)
	if err != nil {
		return err
	}
	s := st.s0
	// One wait per call: upload, batch and download are queued in order,
	// and the download returns once everything before it has retired.
	var res [readLen]byte
	err = s.Write(st.work, offX, in)
	if err == nil {
		if st.fused != nil {
			err = s.Submit(st.forward, st.fused...)
		} else {
			err = s.SubmitBatch(st.batch...)
		}
	}
	if err == nil {
		err = s.Read(st.work, offScores, res[:])
	}
	if err == nil {
		// Idle by now: reports a launch that failed, without waiting.
		err = s.Sync()
	}
	if err != nil {
		if errors.Is(err, stagehost.ErrInvalidArgument) {
			// A handle went bad (or a launch was malformed): start over
			// next time.
			inst = nil
		}
		return err
	}
	// res: 4 scores, then the class and its score.
	var out [model.OutputSize]byte
	copy(out[0:4], res[4*model.Classes:4*model.Classes+4])
	copy(out[4:], res[:4*model.Classes])
	if class := binary.LittleEndian.Uint32(out[:4]); class >= model.Classes {
		return errors.New("mlp: argmax returned class " + strconv.Itoa(int(class)))
	}
	return c.Write(out[:])
}

type inputError struct{ n int }

func (e *inputError) Error() string {
	return "mlp: input must be " + strconv.Itoa(model.InputSize) + " bytes (8 float32), got " + strconv.Itoa(e.n)
}

// Unwrap makes the client error code INVALID_ARGUMENT.
func (e *inputError) Unwrap() error { return stagehost.ErrInvalidArgument }

// contextError prefixes an error with context and keeps it in the chain
// (fmt.Errorf would do, at the cost of linking fmt).
type contextError struct {
	context string
	err     error
}

func (e *contextError) Error() string { return e.context + ": " + e.err.Error() }
func (e *contextError) Unwrap() error { return e.err }
