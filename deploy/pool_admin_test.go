package deploy

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stagehost/stagehost/errdefs"
)

// disposals records the pool's dispose calls, checking each is the
// first for its instance and that no caller holds it.
type disposals struct {
	t    *testing.T
	mu   sync.Mutex
	seen map[*fakeInst]int
}

func watchDisposals(t *testing.T, p *pool[*fakeInst]) *disposals {
	d := &disposals{t: t, seen: map[*fakeInst]int{}}
	p.dispose = func(m *member[*fakeInst]) {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.seen[m.val]++
		if d.seen[m.val] != 1 {
			t.Errorf("instance %s disposed %d times", m.val.name, d.seen[m.val])
		}
		p.mu.Lock()
		lent := m.lent
		p.mu.Unlock()
		if lent {
			t.Errorf("instance %s disposed while lent", m.val.name)
		}
	}
	return d
}

func (d *disposals) count(f *fakeInst) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.seen[f]
}

func fakes(names ...string) ([]*fakeInst, []string) {
	var insts []*fakeInst
	var devs []string
	for i, n := range names {
		insts = append(insts, &fakeInst{name: n})
		devs = append(devs, "gpu"+string(rune('0'+i)))
	}
	return insts, devs
}

// TestPoolReplaceAllDrainsLentInstances: the swap. A free old instance
// is disposed at once; a lent one only when its call releases it; new
// calls get only new instances.
func TestPoolReplaceAllDrainsLentInstances(t *testing.T) {
	p, old, _ := newFakePool(t, 2, 4, 0, nil)
	disp := watchDisposals(t, p)
	ctx := context.Background()
	held, err := p.acquire(ctx) // a call in flight on old[0]
	if err != nil || held.val != old[0] {
		t.Fatal(held, err)
	}
	fresh, devs := fakes("x", "y")
	p.replaceAll(fresh, devs)
	if disp.count(old[1]) != 1 {
		t.Fatal("the free old instance was not disposed at once")
	}
	if disp.count(old[0]) != 0 {
		t.Fatal("the lent old instance was disposed during its call")
	}
	if n := len(p.drainingMembers()); n != 1 {
		t.Fatalf("draining %d, want 1", n)
	}
	got := map[*fakeInst]bool{}
	for range 2 {
		m, err := p.acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got[m.val] = true
	}
	if !got[fresh[0]] || !got[fresh[1]] {
		t.Fatalf("after the swap, calls got %v, want the new instances", got)
	}
	p.release(held) // the drain ends
	if disp.count(old[0]) != 1 || len(p.drainingMembers()) != 0 {
		t.Fatal("the old instance was not disposed when its call ended")
	}
	if live, free, waiting := p.stats(); live != 2 || free != 0 || waiting != 0 {
		t.Fatalf("live %d free %d waiting %d", live, free, waiting)
	}
}

// TestPoolReplaceAllServesWaitersInOrder: callers waiting at the swap
// get the new instances, first come first served; the old instance,
// released after, goes to nobody.
func TestPoolReplaceAllServesWaitersInOrder(t *testing.T) {
	p, old, queued := newFakePool(t, 1, 4, 0, nil)
	disp := watchDisposals(t, p)
	ctx := context.Background()
	held, _ := p.acquire(ctx)
	got := make(chan *fakeInst, 2)
	for range 2 {
		go func() {
			m, err := p.acquire(ctx)
			if err != nil {
				t.Error(err)
				got <- nil
				return
			}
			got <- m.val
			p.release(m)
		}()
		recvWithin(t, queued, "a caller queued")
	}
	fresh, devs := fakes("x")
	p.replaceAll(fresh, devs)
	for range 2 {
		select {
		case v := <-got:
			if v != fresh[0] {
				t.Fatalf("a waiter got %v, want the new instance", v)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a waiter was not served by the new instance")
		}
	}
	p.release(held)
	if disp.count(old[0]) != 1 {
		t.Fatal("the old instance was not disposed")
	}
	if live, free, waiting := p.stats(); live != 1 || free != 1 || waiting != 0 {
		t.Fatalf("live %d free %d waiting %d", live, free, waiting)
	}
}

// TestPoolReplaceAtRevivesAnOutOfServicePool: the reset. A quarantined
// instance, lent or not, is replaced in its index; live counts the new
// one only; a pool whose every instance was out of service serves again.
func TestPoolReplaceAtRevivesAnOutOfServicePool(t *testing.T) {
	p, old, queued := newFakePool(t, 2, 4, 0, nil)
	disp := watchDisposals(t, p)
	ctx := context.Background()
	errQ := errdefs.Errorf(errdefs.ErrDeviceLost, "quarantined")
	a, _ := p.acquire(ctx)
	b, _ := p.acquire(ctx)
	old[0].fail(errQ)
	p.release(a) // out of service
	// A caller waits for b; a is replaced while b is lent.
	done := make(chan *member[*fakeInst], 1)
	go func() {
		m, err := p.acquire(ctx)
		if err != nil {
			t.Error(err)
		}
		done <- m
	}()
	recvWithin(t, queued, "the caller queued")
	fresh, _ := fakes("x")
	if !p.replaceAt(0, fresh[0], "gpu1") {
		t.Fatal("replaceAt(0) refused")
	}
	m := <-done
	if m == nil || m.val != fresh[0] || m.index != 0 || m.device != "gpu1" {
		t.Fatalf("the waiter got %+v, want the fresh instance 0 on gpu1", m)
	}
	if disp.count(old[0]) != 1 {
		t.Fatal("the replaced idle instance was not disposed at once")
	}
	// b is quarantined during its call, and replaced before its release:
	// live must not count it twice out.
	old[1].fail(errQ)
	fresh2, _ := fakes("y")
	p.replaceAt(1, fresh2[0], "gpu1")
	if live, _, _ := p.stats(); live != 2 {
		t.Fatalf("live %d, want 2", live)
	}
	if disp.count(old[1]) != 0 {
		t.Fatal("disposed while lent")
	}
	p.release(b)
	p.release(m)
	if disp.count(old[1]) != 1 {
		t.Fatal("the lent quarantined instance was not disposed at its release")
	}
	if live, free, _ := p.stats(); live != 2 || free != 2 {
		t.Fatalf("live %d free %d", live, free)
	}
	if p.replaceAt(5, fresh[0], "gpu0") {
		t.Fatal("replaceAt out of range changed the pool")
	}

	// Every instance out of service, then one revived.
	q, qi, _ := newFakePool(t, 1, 4, 0, nil)
	qi[0].fail(errQ)
	n, _ := q.acquire(ctx)
	q.release(n)
	if _, err := q.acquire(ctx); !errors.Is(err, errdefs.ErrDeviceLost) {
		t.Fatalf("all out: %v", err)
	}
	fresh3, _ := fakes("z")
	q.replaceAt(0, fresh3[0], "gpu0")
	if m, err := q.acquire(ctx); err != nil || m.val != fresh3[0] {
		t.Fatalf("after the reset: %v, %v", m, err)
	}
}

// TestPoolHammerWithReplacements: callers come and go (some giving up)
// while the member set is swapped and instances replaced. No instance is
// lent twice at once, none is lent after it was disposed, each retired
// one is disposed exactly once, and the books balance at the end.
func TestPoolHammerWithReplacements(t *testing.T) {
	const n = 3
	p, first, _ := newFakePool(t, n, 1000, 0, nil)
	p.onQueue = nil
	var mu sync.Mutex
	disposed := map[*fakeInst]int{}
	inUse := map[*fakeInst]*atomic.Int32{}
	var all []*fakeInst
	track := func(fs []*fakeInst) {
		mu.Lock()
		for _, f := range fs {
			inUse[f] = &atomic.Int32{}
			all = append(all, f)
		}
		mu.Unlock()
	}
	track(first)
	p.dispose = func(m *member[*fakeInst]) {
		mu.Lock()
		disposed[m.val]++
		c := inUse[m.val]
		mu.Unlock()
		if c.Load() != 0 {
			t.Error("an instance was disposed while a caller held it")
		}
	}
	stop := make(chan struct{})
	var swaps sync.WaitGroup
	swaps.Add(1)
	go func() {
		defer swaps.Done()
		r := rand.New(rand.NewPCG(99, 1))
		for k := 0; ; k++ {
			select {
			case <-stop:
				return
			default:
			}
			if r.IntN(2) == 0 {
				fs, devs := fakes("a", "b", "c")
				track(fs)
				p.replaceAll(fs, devs)
			} else {
				fs, _ := fakes("r")
				track(fs)
				p.replaceAt(r.IntN(n), fs[0], "gpu0")
			}
			runtime.Gosched()
		}
	}()
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 2))
			for range 300 {
				limit := 10 * time.Second
				if r.IntN(3) == 0 {
					limit = time.Duration(r.IntN(30)) * time.Microsecond
				}
				ctx, cancel := context.WithTimeout(context.Background(), limit)
				m, err := p.acquire(ctx)
				cancel()
				if err != nil {
					if !errors.Is(err, errdefs.ErrDeadlineExceeded) {
						t.Error(err)
					}
					continue
				}
				mu.Lock()
				c, gone := inUse[m.val], disposed[m.val]
				mu.Unlock()
				if gone != 0 {
					t.Error("a disposed instance was lent")
				}
				if c.Add(1) != 1 {
					t.Error("an instance was lent twice")
				}
				for range r.IntN(4) {
					runtime.Gosched()
				}
				c.Add(-1)
				p.release(m)
			}
		}()
	}
	wg.Wait()
	close(stop)
	swaps.Wait()
	if t.Failed() {
		return
	}
	current := map[*fakeInst]bool{}
	for _, m := range p.members() {
		current[m.val] = true
	}
	mu.Lock()
	defer mu.Unlock()
	for _, f := range all {
		want := 1
		if current[f] {
			want = 0
		}
		if disposed[f] != want {
			t.Fatalf("instance %p (%s) disposed %d times, want %d", f, f.name, disposed[f], want)
		}
	}
	if live, free, waiting := p.stats(); live != n || free != n || waiting != 0 || len(p.drainingMembers()) != 0 {
		t.Fatalf("after the hammer: live %d free %d waiting %d draining %d", live, free, waiting, len(p.drainingMembers()))
	}
}
