package ops

import (
	"encoding/binary"
	"testing"
)

// FuzzValidateRun: whatever the arguments, Validate never panics, and a
// launch it accepts runs without touching memory outside its ranges (the
// memory given is exactly the ranges, so any stray index panics).
func FuzzValidateRun(f *testing.F) {
	f.Add([]byte{0, 2, 1, 16, 1, 16, 0, 0})
	f.Add([]byte("\x30\x0e\x01\x10\x01\x10\x01\x10\x00\x02\x00\x02\x00\x02\x00\x00\x00\x00\x00\x01\x00\x01\x00\x01\x00\x00"))
	names := Names()
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		k, _ := Lookup(names[int(data[0])%len(names)])
		n := int(data[1]) % 17
		data = data[2:]
		args := make([]Arg, n)
		mem := make([][]byte, n)
		addr := uint64(4096)
		for i := range args {
			if len(data) < 2 {
				return
			}
			kind, v := data[0], data[1]
			data = data[2:]
			switch kind % 3 {
			case 0: // a scalar: small, or 64 bits from the input
				val := uint64(v % 8)
				if v >= 250 && len(data) >= 8 {
					val = binary.LittleEndian.Uint64(data)
					data = data[8:]
				}
				args[i] = Arg{Value: val}
			case 1: // a fresh range of v*2 bytes
				l := uint64(v) * 2
				args[i] = Arg{Buffer: true, Addr: addr, Len: l}
				mem[i] = make([]byte, l)
				addr += (l + 63) &^ 63
			default: // the same range as an earlier buffer argument
				j := int(v) % max(i, 1)
				if i == 0 || !args[j].Buffer {
					args[i] = Arg{Buffer: true, Addr: addr, Len: 0}
					mem[i] = []byte{}
					continue
				}
				args[i], mem[i] = args[j], mem[j]
			}
		}
		if k.Validate(args) != nil {
			return
		}
		if err := k.Run(args, mem); err != nil {
			t.Fatalf("%s: validated, then Run: %v", k.Name, err)
		}
	})
}
