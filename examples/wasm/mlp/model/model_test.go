package model

import (
	"bytes"
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
