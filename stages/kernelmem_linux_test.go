package stages

import (
	"context"
	"encoding/binary"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// residentBytes is the process's resident set (VmRSS), or -1.
func residentBytes() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "VmRSS:" {
			n, err := strconv.ParseInt(f[1], 10, 64)
			if err == nil {
				return n << 10
			}
		}
	}
	return -1
}

// TestKernelMemoryIsReturnedAfterALaunch: a launch that grows its
// memory to the kernel memory limit (256 MiB), touching every byte,
// gives it back to the system when it ends: the process's resident set
// and the Go heap are what they were before the launch, with no garbage
// collection. (With wazero's own memory, a Go slice grown by appending,
// one such launch allocated about 1.4 GiB of Go memory, and the process
// stayed at 1.0 to 1.2 GB resident.)
func TestKernelMemoryIsReturnedAfterALaunch(t *testing.T) {
	if testing.Short() {
		t.Skip("touches 256 MiB per launch")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	eng, err := NewEngine(ctx, NewEngineConfig().WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(ctx)
	// The time limit is no part of this test: a launch on a slow
	// machine must not be cut short.
	k, err := eng.LoadKernel(ctx, kernelFile(t, "growcap"), doubleSpec, NewKernelConfig().WithTimeLimit(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close(ctx)
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	rss0, alloc0 := residentBytes(), ms.TotalAlloc
	if rss0 < 0 {
		t.Skip("no VmRSS in /proc/self/status")
	}
	for i := range 2 {
		y := make([]byte, 16)
		start := time.Now()
		if err := k.Run(ctx, KernelArgs{Bufs: [][]byte{make([]byte, 16), y, nil}, Scalars: []uint64{0, 0, 4}}); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		if pages := binary.LittleEndian.Uint32(y); pages != DefaultKernelMemoryLimit>>16 {
			t.Fatalf("the kernel reached %d pages, want %d", pages, DefaultKernelMemoryLimit>>16)
		}
		runtime.ReadMemStats(&ms)
		rss, alloc := residentBytes(), ms.TotalAlloc-alloc0
		t.Logf("launch %d: %v; resident %d MiB (%d MiB before); Go memory allocated since: %d KiB", i, took.Round(time.Millisecond), rss>>20, rss0>>20, alloc>>10)
		if rss > rss0+64<<20 {
			t.Errorf("launch %d: resident %d MiB after the launch, %d MiB before: its memory was not given back", i, rss>>20, rss0>>20)
		}
		if alloc > 16<<20 {
			t.Errorf("launch %d: %d MiB of Go memory allocated by the launches: the kernel's memory is Go memory", i, alloc>>20)
		}
	}
}

// TestKernelMemoryGrows: a kernel's memory keeps its bytes and its
// address as it grows, its new bytes are zero, it refuses to grow past
// its reservation, and where the reservation cannot be made it is Go
// memory that grows the same way.
func TestKernelMemoryGrows(t *testing.T) {
	for _, max := range []uint64{4 << 16, 1 << 62} { // 1<<62: mmap fails
		m := &kernelMemory{}
		lm := m.Allocate(1<<16, max)
		if mapped := max < 1<<62; m.mapped != mapped {
			t.Fatalf("max %d: mapped %v, want %v", max, m.mapped, mapped)
		}
		a := lm.Reallocate(1 << 16)
		if len(a) != 1<<16 {
			t.Fatalf("max %d: %d bytes, want %d", max, len(a), 1<<16)
		}
		a[0], a[len(a)-1] = 1, 2
		b := lm.Reallocate(3 << 16)
		if len(b) != 3<<16 || b[0] != 1 || b[1<<16-1] != 2 || !allZero(b[1<<16:]) {
			t.Fatalf("max %d: grown memory lost its bytes or is not zero past them", max)
		}
		if m.mapped && &a[0] != &b[0] {
			t.Fatalf("max %d: the mapped memory moved as it grew", max)
		}
		if m.mapped && lm.Reallocate(5<<16) != nil {
			t.Fatalf("max %d: grew past its reservation", max)
		}
		lm.Free()
		if m.mapping != nil || m.mapped {
			t.Fatalf("max %d: Free kept the memory", max)
		}
	}
}
