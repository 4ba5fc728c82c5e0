package main

import (
	"testing"

	"github.com/stagehost/stagehost/guest-sdk/emu"
)

func TestMinimal(t *testing.T) {
	e := emu.New(emu.NewConfig())
	for in, want := range map[string]string{"": "ok:", "abc": "ok:cba", "stagehost": "ok:tsohegats"} {
		out, err := e.Run("main", []byte(in))
		if err != nil || string(out) != want {
			t.Errorf("%q: got %q, %v; want %q", in, out, err, want)
		}
	}
}
