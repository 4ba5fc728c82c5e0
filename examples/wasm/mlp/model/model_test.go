package model

import (
	"bytes"
	"math"
	"testing"
)

func TestRecipe(t *testing.T) {
	if NumParams != 212 || OffB1 != 128 || OffW2 != 144 || OffB2 != 208 {
		t.Fatal("layout changed")
	}
	if Param(0) != float32(11-48)/64 || Param(1) != 0 /* (1*37+11)%97-48 = 0 */ || Param(3) != float32((3*37+11)%97-48)/64 {
		t.Fatal("recipe changed")
	}
	if len(ParamBytes()) != 4*NumParams {
		t.Fatal("ParamBytes")
	}
}

func TestForwardUsesEveryClass(t *testing.T) {
	seen := map[int]bool{}
	for _, x := range TestInputs(64) {
		class, scores := Forward(x)
		for _, s := range scores {
			if s > scores[class] {
				t.Fatalf("class %d is not the largest of %v", class, scores)
			}
		}
		seen[class] = true
		out, err := Predict(EncodeInput(x))
		if err != nil {
			t.Fatal(err)
		}
		c, s, err := DecodeOutput(out)
		if err != nil || c != class || s != scores || !bytes.Equal(out, EncodeOutput(class, scores)) {
			t.Fatalf("round trip: %d %v %v", c, s, err)
		}
	}
	if len(seen) < 3 {
		t.Errorf("test inputs reach only classes %v", seen)
	}
	if _, err := Predict(make([]byte, 31)); err == nil {
		t.Error("short input accepted")
	}
}

// fusedForward is Forward with every product added by a fused
// multiply-add (what a GPU's fmaf does), for TestRoundingInputs.
func fusedForward(x [Inputs]float32) [Classes]float32 {
	p := Params()
	fma := func(a, b, c float32) float32 { return float32(math.FMA(float64(a), float64(b), float64(c))) }
	var h [Hidden]float32
	for j := range Hidden {
		for k := range Inputs {
			h[j] = fma(x[k], p[OffW1+k*Hidden+j], h[j])
		}
		h[j] = max(h[j]+p[OffB1+j], 0)
	}
	var s [Classes]float32
	for j := range Classes {
		for k := range Hidden {
			s[j] = fma(h[k], p[OffW2+k*Classes+j], s[j])
		}
		s[j] += p[OffB2+j]
	}
	return s
}

// TestRoundingInputs: TestInputs' products are exact, so fusing changes
// nothing; RoundingInputs' are not, so fusing changes most scores. Only
// the latter tell a device that fuses from one that rounds.
func TestRoundingInputs(t *testing.T) {
	differ := func(xs [][Inputs]float32) int {
		n := 0
		for _, x := range xs {
			if _, s := Forward(x); s != fusedForward(x) {
				n++
			}
		}
		return n
	}
	if n := differ(TestInputs(64)); n != 0 {
		t.Errorf("fusing changes %d of 64 TestInputs outputs", n)
	}
	if n := differ(RoundingInputs(64)); n < 32 {
		t.Errorf("fusing changes only %d of 64 RoundingInputs outputs", n)
	}
	for _, x := range RoundingInputs(64) {
		for _, v := range x {
			if v < -4 || v >= 4 {
				t.Fatalf("input %v outside [-4, 4)", v)
			}
		}
	}
}
