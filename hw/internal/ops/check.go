package ops

import (
	"fmt"
	"math"
	"math/bits"
)

// launch is one launch being validated or run.
type launch struct {
	k    *Kernel
	args []Arg
	mem  [][]byte
}

func (l *launch) errf(arg, format string, a ...any) error {
	return &Error{Kernel: l.k.Name, Arg: arg, Msg: fmt.Sprintf(format, a...)}
}

func (l *launch) validate() error {
	want := len(l.k.info.Args)
	if len(l.args) != want {
		return l.errf("", "takes %d arguments, got %d", want, len(l.args))
	}
	for i, ai := range l.k.info.Args {
		a := l.args[i]
		switch ai.Kind {
		case "buffer":
			if !a.Buffer {
				return l.errf(ai.Name, "%s (argument %d) is a scalar, want a buffer range", ai.Name, i)
			}
			if a.Len > MaxElems*4 {
				return l.errf(ai.Name, "%s has %s bytes, more than %s values", ai.Name, num(a.Len), num(MaxElems))
			}
			if a.Addr > math.MaxUint64-a.Len {
				return l.errf(ai.Name, "%s: range wraps the address space", ai.Name)
			}
			if es := TypeSize(ai.Type); es > 1 {
				if a.Len%uint64(es) != 0 {
					return l.errf(ai.Name, "%s has %s bytes, not a whole number of %s values", ai.Name, num(a.Len), ai.Type)
				}
				if a.Len > 0 && a.Addr%uint64(es) != 0 {
					return l.errf(ai.Name, "%s is not %d-byte aligned", ai.Name, es)
				}
			}
		case "scalar":
			if a.Buffer {
				return l.errf(ai.Name, "%s (argument %d) is a buffer range, want a scalar", ai.Name, i)
			}
			if (ai.Type == "u32" || ai.Type == "f32") && a.Value > math.MaxUint32 {
				return l.errf(ai.Name, "%s = %s does not fit 32 bits", ai.Name, num(a.Value))
			}
		}
	}
	return l.checkOp()
}

// TypeSize is the size in bytes of one value of a buffer of dtype t
// (f32, i32: 4; f16, bf16: 2; bytes and anything else: 1).
func TypeSize(t string) int {
	switch t {
	case "f32", "i32":
		return 4
	case "f16", "bf16":
		return 2
	}
	return 1
}

// index returns the position of the argument called name.
func (l *launch) index(name string) int {
	for i, a := range l.k.info.Args {
		if a.Name == name {
			return i
		}
	}
	panic("ops: " + l.k.Name + " has no argument " + name)
}

// count is buffer argument name's number of values of its type.
func (l *launch) count(name string) uint64 {
	i := l.index(name)
	return l.args[i].Len / uint64(TypeSize(l.k.info.Args[i].Type))
}

// scalar returns scalar argument name.
func (l *launch) scalar(name string) uint64 { return l.args[l.index(name)].Value }

// f32 returns f32 scalar argument name.
func (l *launch) f32(name string) float32 {
	return math.Float32frombits(uint32(l.scalar(name)))
}

// dim returns scalar argument name checked as a dimension: 1 to MaxElems.
func (l *launch) dim(name string) (uint64, error) {
	v := l.scalar(name)
	if v == 0 {
		return 0, l.errf(name, "%s = 0: dimensions must be at least 1", name)
	}
	if v > MaxElems {
		return 0, l.errf(name, "%s = %s exceeds the limit %s", name, num(v), num(MaxElems))
	}
	return v, nil
}

// dims checks up to 8 dimensions in order; the first len(names) values
// of the result are theirs.
func (l *launch) dims(names ...string) (vs [8]uint64, err error) {
	for i, n := range names {
		v, err := l.dim(n)
		if err != nil {
			return vs, err
		}
		vs[i] = v
	}
	return vs, nil
}

// product multiplies vs, refusing an overflow or a result over MaxElems;
// expr names the product in the error.
func (l *launch) product(expr string, vs ...uint64) (uint64, error) {
	p := uint64(1)
	for _, v := range vs {
		hi, lo := bits.Mul64(p, v)
		if hi != 0 || lo > MaxElems {
			return 0, l.errf("", "%s exceeds the limit %s", expr, num(MaxElems))
		}
		p = lo
	}
	return p, nil
}

// wantCount checks that buffer name has want values, expr naming want.
func (l *launch) wantCount(name string, want uint64, expr string) error {
	if got := l.count(name); got != want {
		return l.errf(name, "%s has %s values, %s = %s", name, num(got), expr, num(want))
	}
	return nil
}

// overlap reports whether the ranges of arguments a and b share a byte.
func (l *launch) overlap(a, b string) bool {
	x, y := l.args[l.index(a)], l.args[l.index(b)]
	if x.Len == 0 || y.Len == 0 {
		return false
	}
	return x.Addr < y.Addr+y.Len && y.Addr < x.Addr+x.Len
}

// same reports whether arguments a and b are exactly the same range.
func (l *launch) same(a, b string) bool {
	x, y := l.args[l.index(a)], l.args[l.index(b)]
	return x.Addr == y.Addr && x.Len == y.Len
}

// disjoint refuses any overlap of out with each of ins.
func (l *launch) disjoint(out string, ins ...string) error {
	for _, in := range ins {
		if l.overlap(out, in) {
			return l.errf(out, "%s overlaps %s", out, in)
		}
	}
	return nil
}

// inPlace refuses a partial overlap of out with in: out may be exactly in,
// or disjoint from it.
func (l *launch) inPlace(out, in string) error {
	if l.overlap(out, in) && !l.same(out, in) {
		return l.errf(out, "%s partially overlaps %s (it may be exactly %s, or apart)", out, in, in)
	}
	return nil
}

// halves splits a packed (h | w<<32) scalar.
func halves(v uint64) (lo, hi uint64) { return v & math.MaxUint32, v >> 32 }
