package wasmbin

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestParseBoundsEveryCountByTheBytesLeft: a vector count larger than the
// bytes left is refused, naming the count, before anything is allocated
// for it. The count here is 2^20, small enough that a Parse without the
// check would allocate for it (megabytes, not the 4294967295 entries of
// TestParseRefusesMalformedSections, which would end the test binary with
// an out-of-memory crash instead of a failure); so this test fails
// cleanly, with the bytes Parse allocated, when the check is gone.
func TestParseBoundsEveryCountByTheBytesLeft(t *testing.T) {
	const n = 1 << 20
	big := pu32(n)
	tail := []byte{0x00, 0x00} // a few bytes left after the count
	count := pcat(big, tail)
	expr := func(op byte, imm ...byte) []byte { return pcat([]byte{op}, imm, []byte{0x0b}) }
	withFunc := func(secs ...psec) []byte {
		return pbuild(append([]psec{ptypeSec, pimportSec, pfuncSec}, secs...)...)
	}
	for _, tc := range []struct {
		name, what string
		bin        []byte
	}{
		{"types", "type", pbuild(psec{secType, count})},
		{"imports", "import", pbuild(psec{secImport, count})},
		{"functions", "function", pbuild(psec{secFunction, count})},
		{"tables", "table", pbuild(psec{secTable, count})},
		{"memories", "memory", pbuild(psec{secMemory, count})},
		{"globals", "global", pbuild(psec{secGlobal, count})},
		{"exports", "export", pbuild(psec{secExport, count})},
		{"element segments", "element segment", pbuild(psec{secElement, count})},
		{"function bodies", "function body", pbuild(psec{secCode, count})},
		{"data segments", "data segment", pbuild(psec{secData, count})},
		{"params", "value type", pbuild(psec{secType, vec(pcat([]byte{0x60}, big, tail, []byte{0x00}))})},
		{"locals", "local declaration", withFunc(psec{secCode, vec(pbody(count))})},
		{"element indices", "element", withFunc(ptableSec, psec{secElement, vec(pcat([]byte{0x00}, expr(0x41, 0), count))}, pcodeSec)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			allocated := allocated(func() {
				defer func() {
					if v := recover(); v != nil {
						err = fmt.Errorf("Parse panicked: %v", v)
					}
				}()
				_, err = Parse(tc.bin)
			})
			want := fmt.Sprintf("%s count %d larger than the ", tc.what, n)
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), want) {
				t.Errorf("Parse = %v, want a malformed-module error containing %q", err, want)
			}
			// Linear in the binary: a few KiB of fixed cost, not n entries.
			if limit := uint64(64<<10 + 64*len(tc.bin)); allocated > limit {
				t.Errorf("Parse of a %d-byte binary allocated %d bytes (limit %d): the count %d was not bounded by the bytes left before allocating", len(tc.bin), allocated, limit, n)
			}
		})
	}
}
