package pool

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestLimiterAdapt: the limit rises by one per period while creations wait and the CPUs
// have room, up to hi; falls when they are saturated or nothing waits, down to lo; and
// a rise lets a waiting creation through at once.
func TestLimiterAdapt(t *testing.T) {
	l := newLimiter(2, 4)
	stop := make(chan struct{})
	defer close(stop)
	for range 2 {
		if !l.acquire(stop) {
			t.Fatal("a free slot refused")
		}
	}
	third := make(chan bool, 1)
	go func() { third <- l.acquire(stop) }()
	waitFor(t, "the third creation to wait", func() bool { l.mu.Lock(); defer l.mu.Unlock(); return l.queued == 1 })

	if from, to := l.adapt(0.05); from != 2 || to != 2 {
		t.Errorf("saturated CPUs: %d -> %d, want it kept at 2 (its floor)", from, to)
	}
	select {
	case <-third:
		t.Fatal("a creation went past the limit")
	case <-time.After(20 * time.Millisecond):
	}
	if _, to := l.adapt(0.15); to != 2 {
		t.Errorf("CPUs between the thresholds: limit %d, want 2 kept", to)
	}
	if _, to := l.adapt(0.5); to != 3 {
		t.Errorf("a creation waited with the CPUs half idle: limit %d, want 3", to)
	}
	select {
	case ok := <-third:
		if !ok {
			t.Fatal("the waiting creation was refused")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting creation did not start when the limit rose")
	}
	// Nothing waits now: no rise however idle, and the limit goes back down.
	if _, to := l.adapt(0.9); to != 2 {
		t.Errorf("nothing waited: limit %d, want back to 2", to)
	}
	for range 3 {
		l.release()
	}
	// Waiting again at every period, with room: up to hi and no further.
	go func() {
		for range 6 {
			l.acquire(stop)
		}
	}()
	for want := 3; want <= 5; want++ {
		waitFor(t, "creations to wait", func() bool { l.mu.Lock(); defer l.mu.Unlock(); return l.queued > 0 })
		if _, to := l.adapt(0.9); to != min(want, 4) {
			t.Fatalf("limit %d, want %d", to, min(want, 4))
		}
	}
	if _, to := l.adapt(0.02); to != 3 {
		t.Errorf("saturated CPUs: limit %d, want one less, 3", to)
	}
}

// TestAdaptiveConcurrency: a manager without WithConcurrency creates more sandboxes at
// once than the cores while its creations wait and the CPUs are idle, and no more than
// the cores while they are saturated.
func TestAdaptiveConcurrency(t *testing.T) { synctest.Test(t, adaptiveConcurrency) }

func adaptiveConcurrency(t *testing.T) {
	for _, c := range []struct {
		idle    float64
		atLeast int
		atMost  int
	}{
		{idle: 0.9, atLeast: DefaultConcurrency() + 2, atMost: 4 * DefaultConcurrency()},
		{idle: 0.01, atLeast: 1, atMost: DefaultConcurrency()},
	} {
		f := newFake(100 * time.Millisecond)
		var readings atomic.Int32
		source := func() (float64, bool) { readings.Add(1); return c.idle, true }
		m, p := newManager(t, f, "fake/img?min=24&max=24", withIdleSource(source, 10*time.Millisecond))
		m.Start()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := p.Warmup(ctx, 0); err != nil {
			t.Fatal(err)
		}
		cancel()
		_, _, maxCreate, _ := f.stats()
		if maxCreate < c.atLeast || maxCreate > c.atMost {
			t.Errorf("CPUs %.0f%% idle: %d creations at once, want %d to %d", 100*c.idle, maxCreate, c.atLeast, c.atMost)
		}
		if readings.Load() == 0 {
			t.Error("the idle CPU was never read")
		}
		if _, err := m.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCPUIdle: the host's CPU time reads, and a busy loop on this goroutine leaves less
// than all of it idle.
func TestCPUIdle(t *testing.T) {
	idle := cpuIdle()
	end := time.Now().Add(200 * time.Millisecond)
	for time.Now().Before(end) {
	}
	f, ok := idle()
	if !ok {
		t.Fatal("/proc/stat did not read")
	}
	// One of the host's CPUs was busy all along: at most the others were idle (half a
	// CPU's slack for the loop's own scheduling).
	if most := 1 - 0.5/float64(runtime.NumCPU()); f < 0 || f > most {
		t.Fatalf("idle fraction %v with a CPU busy, want in [0, %.2f]", f, most)
	}
}
