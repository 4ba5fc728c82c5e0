// Command ops measures the op library on a CUDA GPU, from Go through
// hw/cuda (the path a stage's stream_submit takes, without the Wasm call):
// gemm at size³ (default 4096³) in the fast tier (cuBLAS) and the exact
// tier, in float32, bfloat16 and float16 storage, and the memory-bound
// ops softmax, log_softmax, layernorm, rmsnorm and add on tensors of -mib MiB (default 256).
// The reference numbers come from bench/cuda/gemm_cublas.c (cuBLAS called
// from C, and a device-to-device copy's bandwidth); pass its output with
// -ref to print the ratios.
//
// Build here, run on the GPU machine:
//
//	CGO_ENABLED=0 go build -o /tmp/opsbench ./bench/cuda/ops
//	nvcc -O2 -o /tmp/gemm_cublas bench/cuda/gemm_cublas.c -lcublas
//	/tmp/gemm_cublas > /tmp/ref.txt
//	/tmp/opsbench -ref /tmp/ref.txt
//
// Each measurement submits -reps launches (after one warm-up) and waits
// for them with one Sync; time per launch is the wall time over reps.
// GB/s counts the bytes each op must move at least: softmax, log_softmax,
// layernorm and rmsnorm read the tensor (rows of 1024 values) once and
// write it once (2 × its size, as the copy's figure counts), add reads
// two tensors and writes one (3 × its size). -only picks programs and
// -cdata fills the gemm inputs as gemm_cublas.c does, so that runs of
// the two can alternate on the same data.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/cuda"
)

func main() {
	size := flag.Int("n", 4096, "gemm size: M = N = K")
	mib := flag.Int("mib", 256, "size of each memory-bound op's input tensor, MiB")
	reps := flag.Int("reps", 10, "launches per measurement")
	exactReps := flag.Int("exact-reps", 2, "launches per exact-tier gemm measurement (slow)")
	ref := flag.String("ref", "", "gemm_cublas.c's output, for ratios")
	only := flag.String("only", "", "comma-separated programs to measure (gemm.fast, gemm.bf16.fast, gemm.f16.fast, gemm, gemm.bf16, softmax, log_softmax, layernorm, rmsnorm, add); empty: all")
	cdata := flag.Bool("cdata", false, "fill the gemm inputs as gemm_cublas.c does (every byte 0x3c) instead of 1.0 in every value")
	flag.Parse()
	sel = map[string]bool{}
	for _, p := range strings.Split(*only, ",") {
		if p != "" {
			sel[p] = true
		}
	}
	if *cdata {
		gemmWords = map[string]uint32{"": 0x3c3c3c3c, "f16": 0x3c3c3c3c, "bf16": 0x3c3c3c3c}
	}
	if err := run(*size, *mib, *reps, *exactReps, *ref); err != nil {
		fmt.Fprintln(os.Stderr, "ops:", err)
		os.Exit(1)
	}
}

// sel holds the programs -only names (empty: every program).
var sel map[string]bool

func selected(prog string) bool { return len(sel) == 0 || sel[prog] }

// gemmWords are the 32-bit patterns the gemm inputs are filled with, per
// storage type ("" is float32): 1.0 in every value unless -cdata.
var gemmWords = map[string]uint32{"": 0x3f800000, "f16": 0x3c003c00, "bf16": 0x3f803f80}

type row struct {
	name  string
	per   time.Duration
	value float64
	unit  string
	refOf string // reference line name
}

func run(n, mib, reps, exactReps int, refPath string) error {
	p, err := cuda.Open(cuda.NewConfig())
	if err != nil {
		return err
	}
	defer p.Close()
	if v, err := p.BLAS(); err != nil {
		fmt.Printf("cuBLAS: %v (the fast tier runs the exact kernels)\n", err)
	} else {
		fmt.Printf("cuBLAS version %d\n", v)
	}
	dev := p.Devices()[0]
	s, err := dev.NewStream()
	if err != nil {
		return err
	}
	defer s.Close(context.Background())
	ctx := context.Background()
	var bufs []hw.Buffer
	defer func() {
		s.Sync(ctx)
		for _, b := range bufs {
			b.Free()
		}
	}()
	fill, err := dev.Prepare("fill")
	if err != nil {
		return err
	}
	alloc := func(bytes int, word uint32) (hw.Buffer, error) {
		b, err := dev.Alloc(bytes, 0, nil)
		if err != nil {
			return nil, err
		}
		bufs = append(bufs, b)
		_, err = s.Submit(&hw.Command{Program: fill, Args: []hw.Arg{hw.BufferArg(b, 0, -1), hw.Float32(math.Float32frombits(word))}})
		return b, err
	}
	// time runs cmd reps times after one warm-up.
	timeIt := func(cmd *hw.Command, reps int) (time.Duration, error) {
		if _, err := s.Submit(cmd); err != nil {
			return 0, err
		}
		if err := s.Sync(ctx); err != nil {
			return 0, err
		}
		start := time.Now()
		for range reps {
			if _, err := s.Submit(cmd); err != nil {
				return 0, err
			}
		}
		if err := s.Sync(ctx); err != nil {
			return 0, err
		}
		return time.Since(start) / time.Duration(reps), nil
	}
	var rows []row
	words := gemmWords
	for _, g := range []struct {
		prog, dt string
		fast     bool
	}{
		{"gemm.fast", "", true}, {"gemm.bf16.fast", "bf16", true}, {"gemm.f16.fast", "f16", true},
		{"gemm", "", false}, {"gemm.bf16", "bf16", false},
	} {
		if !selected(g.prog) {
			continue
		}
		es := 4
		if g.dt != "" {
			es = 2
		}
		var mats [3]hw.Buffer
		for i := range mats {
			if mats[i], err = alloc(es*n*n, words[g.dt]); err != nil {
				return err
			}
		}
		prog, err := dev.Prepare(g.prog)
		if err != nil {
			return err
		}
		u := func(v int) hw.Arg { return hw.Uint(uint64(v)) }
		cmd := &hw.Command{Program: prog, Args: []hw.Arg{
			hw.BufferArg(mats[0], 0, -1), hw.BufferArg(mats[1], 0, -1), hw.BufferArg(mats[2], 0, -1),
			u(n), u(n), u(n), u(0), u(0), hw.Float32(1), hw.Float32(0), u(1), u(0), u(0), u(0)}}
		r := reps
		if !g.fast {
			r = exactReps
		}
		per, err := timeIt(cmd, r)
		if err != nil {
			return fmt.Errorf("%s: %w", g.prog, err)
		}
		dt := g.dt
		if dt == "" {
			dt = "f32"
		}
		rows = append(rows, row{name: fmt.Sprintf("%s %d³ (Go, hw/cuda)", g.prog, n), per: per,
			value: 2 * float64(n) * float64(n) * float64(n) / per.Seconds() / 1e9, unit: "GFLOP/s",
			refOf: fmt.Sprintf("gemm_%s_%d_cublas_c", dt, n)})
		for _, b := range mats {
			s.Sync(ctx)
			b.Free()
		}
		bufs = bufs[:0]
	}
	if !selected("softmax") && !selected("log_softmax") && !selected("layernorm") && !selected("rmsnorm") && !selected("add") {
		return report(rows, refPath)
	}
	// Memory-bound ops on float32 tensors of mib MiB: rows of 1024.
	vals := mib << 20 / 4
	cols := 1024
	nrows := vals / cols
	x, err := alloc(4*vals, 0x3f800000)
	if err != nil {
		return err
	}
	x2, err := alloc(4*vals, 0x3f800000)
	if err != nil {
		return err
	}
	y, err := alloc(4*vals, 0)
	if err != nil {
		return err
	}
	gb, err := alloc(4*cols, 0x3f800000)
	if err != nil {
		return err
	}
	bb, err := alloc(4*cols, 0)
	if err != nil {
		return err
	}
	u := func(v int) hw.Arg { return hw.Uint(uint64(v)) }
	X, Y := hw.BufferArg(x, 0, -1), hw.BufferArg(y, 0, -1)
	for _, m := range []struct {
		prog  string
		args  []hw.Arg
		bytes float64
	}{
		{"softmax", []hw.Arg{X, Y, u(nrows), u(cols), u(0)}, 2},
		{"log_softmax", []hw.Arg{X, Y, u(nrows), u(cols), u(0)}, 2},
		{"layernorm", []hw.Arg{X, hw.BufferArg(gb, 0, -1), hw.BufferArg(bb, 0, -1), Y, u(nrows), u(cols), hw.Float32(1e-5)}, 2},
		{"rmsnorm", []hw.Arg{X, hw.BufferArg(gb, 0, -1), Y, u(nrows), u(cols), hw.Float32(1e-5)}, 2},
		{"add", []hw.Arg{X, hw.BufferArg(x2, 0, -1), Y, u(1), u(1), u(nrows), u(cols), u(1), u(1), u(nrows), u(cols)}, 3},
	} {
		if !selected(m.prog) {
			continue
		}
		prog, err := dev.Prepare(m.prog)
		if err != nil {
			return err
		}
		per, err := timeIt(&hw.Command{Program: prog, Args: m.args}, reps)
		if err != nil {
			return fmt.Errorf("%s: %w", m.prog, err)
		}
		rows = append(rows, row{name: fmt.Sprintf("%s %d MiB f32 (Go, hw/cuda)", m.prog, mib), per: per,
			value: m.bytes * float64(4*vals) / per.Seconds() / 1e9, unit: "GB/s", refOf: fmt.Sprintf("d2d_copy_%dMiB", mib)})
	}
	return report(rows, refPath)
}

// report prints the rows, with their ratios to the reference numbers.
func report(rows []row, refPath string) error {
	refs := readRef(refPath)
	fmt.Printf("%-44s %12s %12s %10s %s\n", "measurement", "per launch", "rate", "unit", "vs reference")
	for _, r := range rows {
		vs := ""
		if v, ok := refs[r.refOf]; ok && v > 0 {
			vs = fmt.Sprintf("%.2f× %s (%.1f)", r.value/v, r.refOf, v)
		}
		fmt.Printf("%-44s %12v %12.1f %10s %s\n", r.name, r.per.Round(time.Microsecond), r.value, r.unit, vs)
	}
	for k, v := range refs {
		fmt.Printf("reference %-34s %12.1f\n", k, v)
	}
	return nil
}

// readRef reads "name value unit" lines.
func readRef(path string) map[string]float64 {
	out := map[string]float64{}
	if path == "" {
		return out
	}
	f, err := os.Open(path)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 2 {
			if v, err := strconv.ParseFloat(fs[1], 64); err == nil {
				out[fs[0]] = v
			}
		}
	}
	return out
}
