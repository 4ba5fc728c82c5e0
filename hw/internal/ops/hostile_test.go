package ops

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// validLaunch returns a valid launch of k (lengths and scalars only; the
// buffers lie apart from each other), with random dims.
func validLaunch(r *rand.Rand, k *Kernel) []Arg {
	es := uint64(k.DType.Size())
	addr := uint64(1 << 20)
	buf := func(n, size uint64) Arg {
		a := Arg{Buffer: true, Addr: addr, Len: n * size}
		addr += (n*size + 4095) &^ 63
		return a
	}
	t := func(n int) Arg { return buf(uint64(n), es) }
	f := func(n int) Arg { return buf(uint64(n), 4) }
	u := func(v int) Arg { return Arg{Value: uint64(v)} }
	between := func(lo, hi int) int { return lo + r.IntN(hi-lo+1) }
	switch k.Op {
	case "affine":
		n := between(1, 50)
		return []Arg{t(n), t(n), u(0x3f800000), u(0)}
	case "add", "sub", "mul", "div", "max", "min":
		var a, b [4]int
		na, nb, nc := 1, 1, 1
		for i := range 4 {
			c := between(2, 3)
			a[i], b[i] = c, c
			switch r.IntN(3) {
			case 0:
				a[i] = 1
			case 1:
				b[i] = 1
			}
			na, nb, nc = na*a[i], nb*b[i], nc*c
		}
		args := []Arg{t(na), t(nb), t(nc)}
		for _, d := range a {
			args = append(args, u(d))
		}
		for _, d := range b {
			args = append(args, u(d))
		}
		return args
	case "reduce_sum", "reduce_mean", "reduce_max", "reduce_argmax":
		o, n, i := between(1, 3), between(2, 40), between(1, 3)
		y := t(o * i)
		if k.Op == "reduce_argmax" {
			y = f(o * i)
		}
		return []Arg{t(o * n * i), y, u(o), u(n), u(i)}
	case "softmax", "log_softmax":
		rows, cols := between(1, 4), between(2, 40)
		return []Arg{t(rows * cols), t(rows * cols), u(rows), u(cols), u(between(0, cols))}
	case "layernorm":
		rows, cols := between(1, 4), between(2, 40)
		return []Arg{t(rows * cols), t(cols), t(cols), t(rows * cols), u(rows), u(cols), u(0x3727c5ac)}
	case "rmsnorm":
		rows, cols := between(1, 4), between(2, 40)
		return []Arg{t(rows * cols), t(cols), t(rows * cols), u(rows), u(cols), u(0x3727c5ac)}
	case "transpose":
		d := [4]int{between(1, 3), between(2, 3), between(2, 4), between(2, 5)}
		p := r.Perm(4)
		n := d[0] * d[1] * d[2] * d[3]
		return []Arg{t(n), t(n), u(d[0]), u(d[1]), u(d[2]), u(d[3]), u(p[0]), u(p[1]), u(p[2]), u(p[3])}
	case "gemm":
		m, n, kk, batch := between(2, 6), between(2, 6), between(2, 9), between(1, 3)
		sa, sb, sc := m*kk+r.IntN(3), 0, m*n+r.IntN(2)
		return []Arg{t((batch-1)*sa + m*kk), t((batch-1)*sb + kk*n), t((batch-1)*sc + m*n),
			u(m), u(n), u(kk), u(r.IntN(2)), u(r.IntN(2)), u(0x3f800000), u(0), u(batch), u(sa), u(sb), u(sc)}
	case "gather":
		rows, cols, n := between(2, 9), between(2, 5), between(1, 6)
		return []Arg{f(rows * cols), f(n), f(n * cols), u(rows), u(cols)}
	case "conv2d":
		g := between(1, 2)
		n, c, kk := between(1, 2), g*between(1, 2), g*between(1, 2)
		h, w, rr, s := between(4, 7), between(4, 7), between(1, 3), between(1, 3)
		p, q := (h+2-rr)/2+1, (w-s)/1+1
		return []Arg{f(n * c * h * w), f(kk * (c / g) * rr * s), f(kk), f(n * kk * p * q),
			u(n), u(c), u(h), u(w), u(kk), u(rr), u(s), {Value: 2 | 1<<32}, {Value: 1}, {Value: 1 | 1<<32}, u(g)}
	case "maxpool2d", "avgpool2d":
		n, c, h, w := between(1, 2), between(1, 3), between(3, 8), between(3, 8)
		p, q := (h-2)/2+1, (w+2-3)/1+1
		return []Arg{f(n * c * h * w), f(n * c * p * q), u(n), u(c), u(h), u(w), u(2), u(3), {Value: 2 | 1<<32}, {Value: 1 << 32}}
	case "cast":
		from, to := r.IntN(4), r.IntN(4)
		n := uint64(between(1, 30))
		return []Arg{buf(n, uint64(DType(from).Size())), buf(n, uint64(DType(to).Size())), u(from), u(to)}
	}
	n := between(1, 50)
	return []Arg{t(n), t(n)}
}

// dimNames are the scalars that are dimensions (1 to MaxElems).
var dimNames = []string{"rows", "cols", "outer", "n", "inner", "M", "N", "K", "batch", "C", "H", "W", "R", "S", "groups",
	"a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3", "d0", "d1", "d2", "d3"}

// Every program refuses every perturbation of a valid launch that breaks
// its contract: a missing or extra argument, a kind swapped, each buffer
// one value longer, each dimension 0 or over the limit, and each output
// shifted to partially overlap each input.
func TestEveryProgramRefusesBrokenLaunches(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, k := range Kernels() {
		info := k.Info()
		for trial := range 4 {
			args := validLaunch(r, k)
			if err := k.Validate(args); err != nil {
				t.Fatalf("%s trial %d: the valid launch was refused: %v", k.Name, trial, err)
			}
			refuse := func(what string, bad []Arg, want string) {
				t.Helper()
				err := k.Validate(bad)
				if err == nil {
					t.Errorf("%s: accepted %s", k.Name, what)
					return
				}
				if !strings.HasPrefix(err.Error(), k.Name+": ") || !strings.Contains(err.Error(), want) {
					t.Errorf("%s: %s: error %q, want it to name the program and %q", k.Name, what, err, want)
				}
			}
			refuse("one argument too few", args[:len(args)-1], "arguments")
			refuse("one argument too many", append(slices.Clone(args), Arg{}), "arguments")
			for i, a := range info.Args {
				bad := slices.Clone(args)
				if a.Kind == "buffer" {
					bad[i] = Arg{Value: 1}
					refuse(a.Name+" as a scalar", bad, a.Name)
					bad[i] = args[i]
					bad[i].Len += uint64(TypeSize(a.Type)) // cast's bytes: one byte, not a whole value
					refuse(a.Name+" one value longer", bad, a.Name)
					continue
				}
				bad[i] = Arg{Buffer: true, Addr: 64, Len: 4}
				refuse(a.Name+" as a buffer", bad, a.Name)
				if slices.Contains(dimNames, a.Name) {
					bad[i] = Arg{Value: 0}
					refuse(a.Name+" = 0", bad, a.Name+" = 0")
					bad[i] = Arg{Value: MaxElems + 1}
					refuse(a.Name+" over the limit", bad, a.Name+" = 2,147,483,648 exceeds the limit")
				}
			}
			for i, out := range info.Args {
				if out.Kind != "buffer" || out.Dir == "in" {
					continue
				}
				for j, in := range info.Args {
					if in.Kind != "buffer" || in.Dir != "in" || args[j].Len <= 4 || args[i].Len == 0 {
						continue
					}
					bad := slices.Clone(args)
					bad[i].Addr = args[j].Addr + 4 // inside the input, not at its start
					refuse(out.Name+" partially overlapping "+in.Name, bad, out.Name)
				}
			}
		}
	}
}
