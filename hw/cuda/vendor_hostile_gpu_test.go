package cuda

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
)

// Hostile vendor kernels on a real GPU (testdata/vendor/README.md): a
// read through another process's device pointer, a hang stopped only by
// the end of its process, and launches that fault or break the device's
// limits. What was measured on the H200 decides what they check
// (docs/security.md, "Tenants: a failure domain per tenant"): a CUDA
// context is no boundary inside one process, a process is. So the other
// tenant is always another process: this test binary started again with
// STAGEHOST_TEST_ROLE (TestMain runs runRole instead of the tests).

// roleEnv names the role a child process of this test binary plays:
// "secret" (holds a buffer of secret words), "spin" (hangs the GPU) or
// "hold" (no GPU: prints HOLDING and blocks).
const roleEnv = "STAGEHOST_TEST_ROLE"

// roleLimit bounds a child's life whatever its parent does: it ends
// itself then (a process's end is what stops its hung kernel).
const roleLimit = 2 * time.Minute

// secretWords is the size of the secret child's buffer, in u64 words.
const secretWords = 512

// runRole is a child process's whole life; it returns the exit status.
func runRole(role string) int {
	time.AfterFunc(roleLimit, func() {
		fmt.Fprintf(os.Stderr, "%s: still running after %s: ending itself\n", role, roleLimit)
		os.Exit(3)
	})
	var err error
	switch role {
	case "secret":
		err = roleSecret()
	case "spin":
		err = roleSpin()
	case "hold": // no GPU: TestRoleChildIsReaped
		fmt.Println("HOLDING")
		select {}
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", role, err)
		return 1
	}
	return 0
}

// roleSecret allocates secretWords u64 words of device memory, fills
// them with random words, prints "SECRET <device pointer> <first word>"
// (hex) and holds the allocation until stdin ends. Then it reads the
// buffer back: it prints "INTACT" when it still holds the secret.
func roleSecret() error {
	p, err := Open(NewConfig())
	if err != nil {
		return err
	}
	dev := p.devices[0]
	buf, err := dev.Alloc(8*secretWords, 0, nil)
	if err != nil {
		return err
	}
	secret := make([]byte, 8*secretWords)
	for {
		if _, err := rand.Read(secret); err != nil {
			return err
		}
		if binary.LittleEndian.Uint32(secret) != 0 { // the low half is what the reader reads
			break
		}
	}
	s, err := dev.NewStream()
	if err != nil {
		return err
	}
	ctx := context.Background()
	if _, err := s.Write(buf, 0, secret); err != nil {
		return err
	}
	if err := s.Sync(ctx); err != nil {
		return err
	}
	fmt.Printf("SECRET %#x %#x\n", uint64(buf.(*buffer).ptr), binary.LittleEndian.Uint64(secret))
	io.Copy(io.Discard, os.Stdin)
	back := make([]byte, len(secret))
	if _, err := s.Read(buf, 0, back); err != nil {
		return err
	}
	if err := s.Sync(ctx); err != nil {
		return err
	}
	if !bytes.Equal(back, secret) {
		return errors.New("the secret buffer changed")
	}
	fmt.Println("INTACT")
	return nil
}

// launchSignal is the real driver with a signal once a cuLaunchKernel
// returned success after armed was set.
type launchSignal struct {
	driver
	armed    atomic.Bool
	once     sync.Once
	launched chan struct{}
}

func (l *launchSignal) LaunchKernel(f cuFunction, grid, block [3]uint32, shm uint32, s cuStream, p *paramBlock, n int) cuResult {
	r := l.driver.LaunchKernel(f, grid, block, shm, s, p, n)
	if r == cudaSuccess && l.armed.Load() {
		l.once.Do(func() { close(l.launched) })
	}
	return r
}

// roleSpin launches testdata/vendor/spin.ptx with its flag never set,
// prints "SPINNING" once cuLaunchKernel has returned, and syncs forever.
func roleSpin() error {
	lib, err := openLibrary(defaultLibrary)
	if err != nil {
		return err
	}
	drv := &launchSignal{driver: lib, launched: make(chan struct{})}
	p, err := Open(NewConfig().withDriver(drv))
	if err != nil {
		return err
	}
	dev := p.devices[0]
	ptx, err := os.ReadFile("testdata/vendor/spin.ptx")
	if err != nil {
		return err
	}
	prog, err := dev.PrepareVendor(ptx, "spin.ptx", "spin", hw.KernelInfo{Name: "spin", Args: []hw.KernelArg{hw.KernelBuffer("flag", "u32", "in", "")}})
	if err != nil {
		return err
	}
	flag, err := dev.Alloc(4, 0, nil) // zeroed: never set
	if err != nil {
		return err
	}
	s, err := dev.NewStream()
	if err != nil {
		return err
	}
	drv.armed.Store(true)
	if _, err := s.Submit(&hw.Command{Program: prog, Args: []hw.Arg{hw.BufferArg(flag, 0, -1)}, Shape: &hw.LaunchShape{Grid: [3]uint32{1, 1, 1}, Block: [3]uint32{1, 1, 1}}}); err != nil {
		return err
	}
	select {
	case <-drv.launched:
	case <-time.After(30 * time.Second):
		return errors.New("cuLaunchKernel of spin did not return within 30s")
	}
	fmt.Println("SPINNING")
	err = s.Sync(context.Background()) // never returns while the kernel spins
	return fmt.Errorf("the spin kernel's sync returned: %v", err)
}

// lockedBuffer collects a child's stderr.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// child is a running child process of this test binary in a role.
type child struct {
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	lines    chan string // its stdout, line by line; closed at EOF
	stderr   *lockedBuffer
	exited   chan struct{} // closed once it has been reaped
	exitedAt time.Time     // when Wait returned (read after exited)
	waitErr  error
}

// startRole starts this test binary as a child in role. It is bounded
// four times over: its own roleLimit, the context's kill at roleLimit,
// Pdeathsig (linux) and a SIGKILL in t.Cleanup. The child is started
// from a goroutine locked to its OS thread until the child is reaped:
// Pdeathsig fires when the starting thread exits, and a thread a
// stream's driver goroutine locked and left would otherwise do that.
func startRole(t *testing.T, role string) *child {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), roleLimit)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), roleEnv+"="+role)
	cmd.SysProcAttr = childProcAttr()
	c := &child{cmd: cmd, lines: make(chan string, 16), stderr: new(lockedBuffer), exited: make(chan struct{})}
	cmd.Stderr = c.stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.stdin = stdin
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			close(c.exited)
			return
		}
		started <- nil
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
		c.waitErr = cmd.Wait()
		c.exitedAt = time.Now()
		close(c.exited)
	}()
	if err := <-started; err != nil {
		cancel()
		t.Fatalf("starting the %s child: %v", role, err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		select {
		case <-c.exited:
		case <-time.After(10 * time.Second):
			t.Errorf("the %s child (pid %d) was not reaped within 10s of SIGKILL", role, cmd.Process.Pid)
		}
		cancel()
	})
	return c
}

// line waits for the child's next stdout line starting with prefix
// (other lines are logged) and returns it.
func (c *child) line(t *testing.T, prefix string, timeout time.Duration) string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				<-c.exited
				t.Fatalf("the child ended (%v) before printing %q; stderr:\n%s", c.waitErr, prefix, c.stderr.String())
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
			t.Logf("child: %s", l)
		case <-deadline:
			t.Fatalf("the child printed no %q within %s; stderr:\n%s", prefix, timeout, c.stderr.String())
		}
	}
}

// TestRoleChildIsReaped: the other process of the hostile-kernel tests,
// without a GPU: its line is read, and a SIGKILL ends it and reaps it,
// with the time of the reap recorded.
func TestRoleChildIsReaped(t *testing.T) {
	c := startRole(t, "hold")
	c.line(t, "HOLDING", 30*time.Second)
	killAt := time.Now()
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the child was not reaped within 10s of SIGKILL")
	}
	var exit *exec.ExitError
	if !errors.As(c.waitErr, &exit) || exit.ExitCode() != -1 || c.exitedAt.Before(killAt) {
		t.Fatalf("after SIGKILL: %v (reaped %v after the kill)", c.waitErr, c.exitedAt.Sub(killAt))
	}
	t.Logf("reaped %s after SIGKILL", c.exitedAt.Sub(killAt))
}

// readScalarPtr prepares testdata/vendor/read_scalar_ptr.ptx: out
// buffer (u32, out), addr u64.
func readScalarPtr(t *testing.T, dev *Device) hw.Program {
	t.Helper()
	prog, err := dev.PrepareVendor(vendorPTX(t, "read_scalar_ptr.ptx"), "read_scalar_ptr.ptx", "read_scalar_ptr",
		hw.KernelInfo{Name: "read_scalar_ptr", Args: []hw.KernelArg{hw.KernelBuffer("out", "u32", "out", ""), hw.KernelScalar("addr", "u64")}})
	if err != nil {
		t.Fatal(err)
	}
	return prog
}

var oneThread = &hw.LaunchShape{Grid: [3]uint32{1, 1, 1}, Block: [3]uint32{1, 1, 1}}

// TestGPUCrossProcessRead: a vendor kernel given another process's
// device pointer (a leaked pointer, passed as a u64 scalar the host
// cannot bound) never reads that process's secret. The launch faults
// (CUDA_ERROR_ILLEGAL_ADDRESS: the device is lost for this process
// only), or, where this process has memory of its own at that virtual
// address, reads that. A positive control first proves the kernel reads
// through a valid pointer (the fault then poisons this process). The
// other process's buffer is intact afterwards.
func TestGPUCrossProcessRead(t *testing.T) {
	if inFreshProcess(t) {
		return
	}
	p := requireGPU(t)
	dev := p.devices[0]
	prog := readScalarPtr(t, dev)
	r := newRig(t, p)
	out := r.alloc(4, 0)
	mine := r.alloc(8*secretWords, 0)

	// The control: the kernel reads this process's own word.
	var w [4]byte
	if _, err := rand.Read(w[:]); err != nil {
		t.Fatal(err)
	}
	own := binary.LittleEndian.Uint32(w[:]) | 1
	binary.LittleEndian.PutUint32(w[:], own)
	r.write(mine, 0, w[:])
	minePtr := uint64(mine.(*buffer).ptr)
	if _, err := r.s.Submit(&hw.Command{Program: prog, Args: []hw.Arg{hw.BufferArg(out, 0, -1), hw.Uint(minePtr)}, Shape: oneThread}); err != nil {
		t.Fatal(err)
	}
	if got := binary.LittleEndian.Uint32(r.read(out, 0, 4)); got != own {
		t.Fatalf("control: the kernel read %#x through this process's pointer %#x, want %#x: it does not read", got, minePtr, own)
	}
	t.Logf("control: read %#x through this process's own pointer %#x", own, minePtr)

	c := startRole(t, "secret")
	fields := strings.Fields(c.line(t, "SECRET ", 60*time.Second))
	if len(fields) != 3 {
		t.Fatalf("secret line %q", fields)
	}
	ptr, err1 := strconv.ParseUint(fields[1], 0, 64)
	first, err2 := strconv.ParseUint(fields[2], 0, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("secret line %q: %v %v", fields, err1, err2)
	}
	secret := uint32(first) // read_scalar_ptr reads a u32: the low half
	r.ctx = testCtx(t)      // the child's start took from the rig's 20 s
	t.Logf("the other process holds %d secret words at %#x (first %#x)", secretWords, ptr, first)

	host := make([]byte, 4)
	start := time.Now()
	_, err := r.s.Submit(&hw.Command{Program: prog, Args: []hw.Arg{hw.BufferArg(out, 0, -1), hw.Uint(ptr)}, Shape: oneThread})
	if err != nil {
		t.Fatalf("submit of the cross-process read: %v", err)
	}
	if _, err = r.s.Read(out, 0, host); err == nil {
		err = r.s.Sync(r.ctx)
	}
	took := time.Since(start)
	got := binary.LittleEndian.Uint32(host)
	if got == secret {
		t.Fatalf("the kernel read the other process's secret %#x through its pointer %#x", secret, ptr)
	}
	switch {
	case err == nil:
		if ptr == minePtr {
			t.Logf("verdict: own memory: the other process's pointer %#x is this process's own buffer too (unified addressing); read %#x, not the secret, in %s", ptr, got, took)
		} else {
			t.Logf("verdict: own memory: read %#x at %#x, not the secret, in %s", got, ptr, took)
		}
	case errors.Is(err, errdefs.ErrDeviceLost) && strings.Contains(err.Error(), "CUDA_ERROR_ILLEGAL_ADDRESS"):
		t.Logf("verdict: fault: CUDA_ERROR_ILLEGAL_ADDRESS %s after the launch: %v", took, err)
	default:
		t.Fatalf("the cross-process read ended with %v after %s, want nil (own memory) or device_lost naming CUDA_ERROR_ILLEGAL_ADDRESS", err, took)
	}

	// The other process is untouched: its secret is intact.
	c.stdin.Close()
	c.line(t, "INTACT", 30*time.Second)
	<-c.exited
	if c.waitErr != nil {
		t.Fatalf("the secret process: %v; stderr:\n%s", c.waitErr, c.stderr.String())
	}
}

// median of ds (ds is reordered).
func median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// TestGPUHangKilled: a vendor kernel that never returns, in another
// process, is stopped by that process's SIGKILL, and the GPU recovers:
// this process's context, healthy throughout, launches at its baseline
// speed again. It measures the noop launch+sync latency (baseline,
// during the hang), the reap (SIGKILL to Wait) and the recovery (SIGKILL
// to the first of 20 consecutive launches under 3× the baseline).
// Limits: the reap within 1 s, the recovery within 1 s (the target,
// 200 ms, is logged as met or not).
func TestGPUHangKilled(t *testing.T) {
	if inFreshProcess(t) {
		return
	}
	p := requireGPU(t)
	r := newRig(t, p)
	noop := &hw.Command{Program: r.prog("noop")}
	launch := func() time.Duration {
		t0 := time.Now()
		if _, err := r.s.Submit(noop); err != nil {
			t.Fatalf("noop submit: %v", err)
		}
		if err := r.s.Sync(r.ctx); err != nil {
			t.Fatalf("noop sync: %v", err)
		}
		return time.Since(t0)
	}
	for range 20 { // warm up
		launch()
	}
	base := make([]time.Duration, 200)
	for i := range base {
		base[i] = launch()
	}
	baseline := median(base)

	c := startRole(t, "spin")
	c.line(t, "SPINNING", 60*time.Second)
	r.ctx = testCtx(t)                 // the child's start took from the rig's 20 s
	time.Sleep(200 * time.Millisecond) // the measurement's settling time, not a synchronisation
	during := make([]time.Duration, 50)
	for i := range during {
		during[i] = launch()
	}
	fastDuring := 0 // launches under the recovery's limit while the child spins
	for _, d := range during {
		if d < 3*baseline {
			fastDuring++
		}
	}
	hung := median(during)
	select {
	case <-c.exited:
		t.Fatalf("the spin process ended by itself (%v); stderr:\n%s", c.waitErr, c.stderr.String())
	default:
	}

	killAt := time.Now()
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Recovery: poll until 20 consecutive launches each under 3x the
	// baseline; the time is when the first of them completed.
	limit := 3 * baseline
	var recovered, maxSeen time.Duration
	run := 0
	for run < 20 {
		d := launch()
		maxSeen = max(maxSeen, d)
		if d >= limit {
			run = 0
		} else if run++; run == 1 {
			recovered = time.Since(killAt)
		}
		if time.Since(killAt) > 5*time.Second {
			t.Fatalf("no 20 consecutive launches under %s within 5s of SIGKILL (max %s)", limit, maxSeen)
		}
	}
	var reap time.Duration
	select {
	case <-c.exited:
		reap = c.exitedAt.Sub(killAt)
	case <-time.After(time.Second):
		t.Fatalf("the spin process was not reaped within %s of SIGKILL", time.Since(killAt).Round(time.Millisecond))
	}
	t.Logf("noop launch+sync: baseline %s (median of 200), during the hang %s (median of 50, %.0fx; min %s, %d of 50 under 3x the baseline)",
		baseline, hung, float64(hung)/float64(baseline), slices.Min(during), fastDuring)
	met := "met"
	if recovered > 200*time.Millisecond {
		met = "missed"
	}
	t.Logf("verdict: reaped %s after SIGKILL; recovered %s after SIGKILL (20 consecutive launches under %s; max latency %s): target 200ms %s",
		reap, recovered, limit, maxSeen, met)
	if reap > time.Second {
		t.Errorf("reaped %s after SIGKILL, want within 1s", reap)
	}
	if recovered > time.Second {
		t.Errorf("recovered %s after SIGKILL, want within 1s", recovered)
	}
	// This process's context works after: a launch with a result.
	b := r.alloc(64, 0)
	if err := r.submit("fill", 0, hw.BufferArg(b, 0, -1), hw.Float32(7)).Wait(r.ctx); err != nil {
		t.Fatalf("fill after the hang: %v", err)
	}
	for i, v := range r.download(b) {
		if v != 7 {
			t.Fatalf("after the hang: b[%d] = %v, want 7", i, v)
		}
	}
}

// TestGPUHostileLaunch: vendor launches that fault end in their
// process's device loss, naming the CUDA error; launches over the
// device's limits are refused at submit with nothing enqueued, and the
// stream works after. Each row in a process of its own.
func TestGPUHostileLaunch(t *testing.T) {
	for _, row := range []struct {
		name, file, entry string
		shape             func(hw.LaunchLimits) *hw.LaunchShape // nil: one thread
		fault             []string                              // the CUDA errors accepted at sync (one of)
		refused           string                                // refused at submit, with this text
	}{
		{name: "store_0x10", file: "store_0x10.ptx", entry: "store_0x10", fault: []string{"CUDA_ERROR_ILLEGAL_ADDRESS"}},
		{name: "trap", file: "trap.ptx", entry: "trap_now", fault: []string{"CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_ILLEGAL_INSTRUCTION"}},
		{name: "shared_over_limit", file: "double.ptx", entry: "double",
			shape: func(l hw.LaunchLimits) *hw.LaunchShape {
				return &hw.LaunchShape{Grid: [3]uint32{1, 1, 1}, Block: [3]uint32{1, 1, 1}, SharedBytes: l.MaxSharedBytes + 1}
			},
			refused: "bytes of shared memory, over the device's limit of"},
		{name: "grid_over_limit", file: "double.ptx", entry: "double",
			shape: func(l hw.LaunchLimits) *hw.LaunchShape {
				return &hw.LaunchShape{Grid: [3]uint32{1, l.MaxGrid[1] + 1, 1}, Block: [3]uint32{1, 1, 1}}
			},
			refused: "launch shape: grid.y = "},
	} {
		t.Run(row.name, func(t *testing.T) {
			if inFreshProcess(t) {
				return
			}
			p := requireGPU(t)
			dev := p.devices[0]
			r := newRig(t, p)
			info := hw.KernelInfo{Name: row.entry}
			var args []hw.Arg
			var y hw.Buffer
			if row.file == "double.ptx" {
				info.Args = []hw.KernelArg{hw.KernelBuffer("x", "f32", "in", ""), hw.KernelBuffer("y", "f32", "out", ""), hw.KernelScalar("n", "u32")}
				x := r.upload([]float32{1, 2, 3, 4})
				y = r.alloc(16, 0)
				args = []hw.Arg{hw.BufferArg(x, 0, -1), hw.BufferArg(y, 0, -1), hw.Uint(4)}
			}
			prog := r.vendor(t, row.file, row.entry, info)
			shape := oneThread
			if row.shape != nil {
				shape = row.shape(dev.LaunchLimits())
			}
			r.sync() // the upload retired: the stream is idle
			st := r.s.(*Stream)
			before := st.rec.Submitted()
			start := time.Now()
			_, err := r.s.Submit(&hw.Command{Program: prog, Args: args, Shape: shape})
			if row.refused != "" {
				if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), row.refused) {
					t.Fatalf("grid %v block %v shared %d: got %v, want invalid_argument containing %q", shape.Grid, shape.Block, shape.SharedBytes, err, row.refused)
				}
				if n := st.rec.Submitted(); n != before || !r.s.Idle() {
					t.Fatalf("the refused launch was enqueued: submitted %d → %d, idle %v", before, n, r.s.Idle())
				}
				// The stream works after the refusal: a good launch.
				if _, err := r.s.Submit(&hw.Command{Program: prog, Args: args, Shape: &hw.LaunchShape{Grid: [3]uint32{1, 1, 1}, Block: [3]uint32{4, 1, 1}}}); err != nil {
					t.Fatalf("a good launch after the refusal: %v", err)
				}
				assertNear(t, "y after the refusal", r.download(y), []float32{2, 4, 6, 8})
				t.Logf("verdict: refused at submit, nothing enqueued, the stream works after: %v", err)
				return
			}
			if err != nil {
				t.Fatalf("submit: %v", err)
			}
			err = r.s.Sync(r.ctx)
			took := time.Since(start)
			if !errors.Is(err, errdefs.ErrDeviceLost) {
				t.Fatalf("sync after %s: %v, want device_lost naming one of %v", took, err, row.fault)
			}
			name := ""
			for _, f := range row.fault {
				if strings.Contains(err.Error(), f) {
					name = f
				}
			}
			if name == "" {
				t.Fatalf("sync after %s: %v, want device_lost naming one of %v", took, err, row.fault)
			}
			if derr := dev.Err(); !errors.Is(derr, errdefs.ErrDeviceLost) {
				t.Fatalf("Device.Err after the fault: %v, want device_lost", derr)
			}
			t.Logf("verdict: fault %s at sync, %s after the launch: %v", name, took, err)
		})
	}
}

// vendor prepares a vendor kernel of testdata/vendor on the rig's device.
func (r *rig) vendor(t *testing.T, file, entry string, info hw.KernelInfo) hw.Program {
	t.Helper()
	prog, err := r.dev.(*Device).PrepareVendor(vendorPTX(t, file), file, entry, info)
	if err != nil {
		t.Fatal(err)
	}
	return prog
}
