package monotime

import (
	"strings"
	"testing"
	"time"
)

func TestNowIsMonotonicAndAgreesWithTimeNow(t *testing.T) {
	a := time.Now()
	b := Now()
	c := time.Now()
	if b.Before(a) || c.Before(b) {
		t.Fatalf("Now %v is not between two time.Now readings %v and %v", b, a, c)
	}
	if d := b.Sub(a); d < 0 || d > time.Second {
		t.Fatalf("Now - time.Now = %v", d)
	}
	if !strings.Contains(b.String(), " m=") {
		t.Fatalf("Now carries no monotonic reading: %v", b)
	}
}

var sink time.Time

func BenchmarkNow(b *testing.B) {
	for b.Loop() {
		sink = Now()
	}
}

func BenchmarkTimeNow(b *testing.B) {
	for b.Loop() {
		sink = time.Now()
	}
}
