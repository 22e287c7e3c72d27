package k8sscale

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	k8s "k8s.io/client-go/kubernetes"

	"github.com/roche-sandbox/roche/internal/testcluster"
)

// Where the claims' time goes: the CPU each process of the machine spent during the
// claim phase (the cluster's components from cluster.sh's pid files, each roched, this
// process with its clients), the machine's busy share, and the API server's own
// account of its requests (its /metrics, read before and after).

// clockTicks is USER_HZ, the unit of /proc's CPU times (100 on every Linux Go runs on).
const clockTicks = 100

// cpuSample is the CPU time of named processes and of the whole machine at a moment.
type cpuSample struct {
	at                time.Time
	procs             map[string]time.Duration
	pids              map[string]int // a component restarted meanwhile is left out
	busy, idle, steal time.Duration  // the machine's, every CPU summed
}

// components are the test cluster's processes whose CPU is accounted by name.
var components = []string{"kube-apiserver", "etcd", "kwok", "kube-controller-manager", "kube-scheduler", "kubelet", "containerd"}

func sampleCPU(rs []*Roched) cpuSample {
	s := cpuSample{at: time.Now(), procs: map[string]time.Duration{}, pids: map[string]int{}}
	for _, name := range components {
		b, err := os.ReadFile(filepath.Join(testcluster.StateDir(), "pids", name+".pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.Fields(string(b) + " x")[0])
		if err != nil {
			continue
		}
		if d, err := procCPU(pid); err == nil {
			s.procs[name], s.pids[name] = d, pid
		}
	}
	for _, r := range rs {
		if r == nil {
			continue
		}
		if d, err := procCPU(r.PID()); err == nil {
			s.procs["roched"] += d
		}
	}
	if d, err := procCPU(os.Getpid()); err == nil {
		s.procs["clients"] = d
	}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal
		for i, v := range f[1:] {
			n, _ := strconv.ParseInt(v, 10, 64)
			d := time.Duration(n) * time.Second / clockTicks
			switch {
			case i == 3 || i == 4:
				s.idle += d
			case i == 7:
				s.steal += d
			case i < 7:
				s.busy += d
			}
		}
	}
	return s
}

// procCPU is a process's user and system time, its threads' included.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// pid (comm) state ... : utime and stime are fields 14 and 15, counted after comm.
	rest := b[bytes.LastIndexByte(b, ')')+2:]
	f := strings.Fields(string(rest))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+st) * time.Second / clockTicks, nil
}

// CPUCost is what a phase cost the machine's CPUs.
type CPUCost struct {
	Wall time.Duration
	// Busy, Idle and Steal (taken by the hypervisor) are the machine's, every CPU summed.
	Busy, Idle, Steal time.Duration
	// Procs are the CPU of each named process: the cluster's components, "roched"
	// (every replica) and "clients" (the run's own process: the clients and its Pod
	// watch).
	Procs map[string]time.Duration
}

func (a cpuSample) to(b cpuSample) CPUCost {
	c := CPUCost{Wall: b.at.Sub(a.at), Busy: b.busy - a.busy, Idle: b.idle - a.idle, Steal: b.steal - a.steal, Procs: map[string]time.Duration{}}
	for k, v := range b.procs {
		if w, ok := a.procs[k]; ok && a.pids[k] == b.pids[k] {
			c.Procs[k] = v - w
		}
	}
	return c
}

// Names lists the processes, most CPU first.
func (c CPUCost) Names() []string {
	names := make([]string, 0, len(c.Procs))
	for k := range c.Procs {
		names = append(names, k)
	}
	slices.SortFunc(names, func(a, b string) int { return int(c.Procs[b] - c.Procs[a]) })
	return names
}

// Other is the machine's busy time not in a named process.
func (c CPUCost) Other() time.Duration {
	o := c.Busy
	for _, v := range c.Procs {
		o -= v
	}
	return o
}

// APIStat is the API server's account of one kind of request in a phase, from its
// metrics: how many, and their total time.
type APIStat struct {
	Count int
	Sum   time.Duration
}

// Mean is the average.
func (s APIStat) Mean() time.Duration {
	if s.Count == 0 {
		return 0
	}
	return s.Sum / time.Duration(s.Count)
}

// apiSeries are the API server's metrics the run reads: name to the label set picked.
var apiSeries = map[string]struct{ metric, labels string }{
	// The API server's time for roched's PATCH of a Pod, from its receipt to its answer.
	"apiserver PATCH pods": {"apiserver_request_duration_seconds", `resource="pods",scope="resource",subresource="",verb="PATCH"`},
	// Within it, etcd's: the read of the Pod and the write of the patched one.
	"etcd get pods":    {"etcd_request_duration_seconds", `operation="get",resource="pods"`},
	"etcd update pods": {"etcd_request_duration_seconds", `operation="update",resource="pods"`},
}

// apiMetrics reads the API server's metrics named in apiSeries.
func apiMetrics(ctx context.Context, cs k8s.Interface) (map[string]APIStat, error) {
	b, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's metrics: %w", err)
	}
	out := map[string]APIStat{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		for name, s := range apiSeries {
			for _, suffix := range []string{"_sum", "_count"} {
				if !strings.HasPrefix(line, s.metric+suffix+"{") || !hasLabels(line, s.labels) {
					continue
				}
				v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
				if err != nil {
					continue
				}
				st := out[name]
				if suffix == "_sum" {
					st.Sum += time.Duration(v * float64(time.Second))
				} else {
					st.Count += int(v)
				}
				out[name] = st
			}
		}
	}
	return out, sc.Err()
}

// hasLabels reports whether a metric line has every label of want ("a="x",b="y"").
func hasLabels(line, want string) bool {
	for _, l := range strings.Split(want, ",") {
		if !strings.Contains(line, l) {
			return false
		}
	}
	return true
}

func subAPI(after, before map[string]APIStat) map[string]APIStat {
	out := map[string]APIStat{}
	for k, a := range after {
		b := before[k]
		out[k] = APIStat{Count: a.Count - b.Count, Sum: a.Sum - b.Sum}
	}
	return out
}
