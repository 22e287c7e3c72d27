package pool

import (
	"bytes"
	"os"
	"strconv"
	"sync"
	"time"
)

// limiter bounds the creations in flight across a manager's pools. Fixed
// (WithConcurrency), its limit stays; adaptive (the default), adapt moves it between lo,
// the machine's cores, and hi, four times as many, by what the host's CPUs did.
type limiter struct {
	mu       sync.Mutex
	limit    int
	lo, hi   int
	inflight int
	queued   int  // creations waiting for a slot now
	starved  bool // a creation had to wait for a slot since the last adapt
	// free is closed and replaced when a slot frees or the limit rises.
	free chan struct{}
}

func newLimiter(lo, hi int) *limiter {
	return &limiter{limit: lo, lo: lo, hi: hi, free: make(chan struct{})}
}

// acquire takes a slot, waiting for one; false when stop closed first.
func (l *limiter) acquire(stop <-chan struct{}) bool {
	l.mu.Lock()
	for l.inflight >= l.limit {
		l.queued++
		l.starved = true
		free := l.free
		l.mu.Unlock()
		select {
		case <-free:
		case <-stop:
			l.mu.Lock()
			l.queued--
			l.mu.Unlock()
			return false
		}
		l.mu.Lock()
		l.queued--
	}
	l.inflight++
	l.mu.Unlock()
	return true
}

func (l *limiter) release() {
	l.mu.Lock()
	l.inflight--
	l.wakeLocked()
	l.mu.Unlock()
}

func (l *limiter) wakeLocked() {
	close(l.free)
	l.free = make(chan struct{})
}

// current is the limit now.
func (l *limiter) current() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.limit
}

// The host's idle CPU, as a fraction, past which adapt raises the limit and under which
// it lowers it. Measured here (2 cores): the docker and oci loads leave 4 to 11% idle at
// the cores' limit, and gain throughput but lose their p99 with more at once; a pool
// warming up on an idle engine leaves 20 to 40%.
const (
	raiseIdle = 0.25
	lowerIdle = 0.10
)

// adapt moves the limit by one after a period in which the host's CPUs were idle for
// the fraction idle. Up, when creations waited for a slot while the CPUs had room: such
// creations wait on something other than this host's CPUs (a microVM booting, a
// Kubernetes Pod being scheduled, a remote engine), and more at once serve the demand
// sooner. Down, when the CPUs are saturated, where more at once only slow each other,
// or when no creation waited. It returns the limit before and after.
func (l *limiter) adapt(idle float64) (from, to int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	from = l.limit
	// Waited in this period: a creation had to wait for a slot, or one still waits.
	waited := l.starved || l.queued > 0
	l.starved = false
	switch {
	case waited && idle >= raiseIdle && l.limit < l.hi:
		l.limit++
		l.wakeLocked()
	case (idle < lowerIdle || !waited) && l.limit > l.lo:
		l.limit--
	}
	return from, l.limit
}

// cpuIdle reads the host's CPU time from /proc/stat and returns a function that gives
// the fraction of it idle since its previous call; ok is false when /proc/stat cannot
// be read (not Linux) or no time passed.
func cpuIdle() func() (idle float64, ok bool) {
	prevIdle, prevTotal, _ := readCPUTimes()
	return func() (float64, bool) {
		idle, total, err := readCPUTimes()
		if err != nil || total <= prevTotal {
			return 0, false
		}
		f := float64(idle-prevIdle) / float64(total-prevTotal)
		prevIdle, prevTotal = idle, total
		return f, true
	}
}

// readCPUTimes sums the "cpu" line of /proc/stat: the idle ticks, and all of them.
func readCPUTimes() (idle, total uint64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	fields := bytes.Fields(line)
	if len(fields) < 5 || string(fields[0]) != "cpu" {
		return 0, 0, os.ErrInvalid
	}
	for i, f := range fields[1:] {
		n, err := strconv.ParseUint(string(f), 10, 64)
		if err != nil {
			return 0, 0, err
		}
		// user nice system idle iowait irq softirq steal guest guest_nice: guest
		// time is already counted in user and nice.
		if i >= 8 {
			break
		}
		total += n
		if i == 3 {
			idle = n
		}
	}
	return idle, total, nil
}

// adaptEvery is how often an adaptive limit is moved.
const adaptEvery = 500 * time.Millisecond
