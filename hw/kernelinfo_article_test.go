package hw_test

import (
	"testing"

	"github.com/stagehost/stagehost/hw"
)

func TestWithArticle(t *testing.T) {
	for typ, want := range map[string]string{
		"i32": "an i32", "f32": "an f32", "f16": "an f16",
		"u32": "a u32", "u64": "a u64", "bf16": "a bf16",
	} {
		if got := hw.WithArticle(typ); got != want {
			t.Errorf("WithArticle(%q) = %q, want %q", typ, got, want)
		}
	}
}
