package k8sscale

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/pool"
	"github.com/roche-sandbox/roche/provider/kubernetes"
)

// roched for the scale run is a process of its own, so that it can be killed with
// SIGKILL: the running program (the test binary, the benchmark) started again with
// childEnv set. It serves the kubernetes provider with WithSimulatedNodes through
// internal/daemon's New and Start, the code roched's main runs once it has read its
// flags, with the same soft memory limit; roched's own flags cannot turn simulated nodes
// on. Beside its socket it serves the count of its requests to the API server
// (counter.go) on a second unix socket.

// childEnv carries the child's DaemonConfig as JSON.
const childEnv = "ROCHE_K8SSCALE_ROCHED"

// softMemoryLimit is what roched's main sets (internal/daemon softMemoryLimit), given
// to the child as GOMEMLIMIT so that its RSS is roched's.
const softMemoryLimit = "256MiB"

// DaemonConfig is what the child roched serves.
type DaemonConfig struct {
	Dir             string `json:"dir"` // socket, state file, counts socket, log
	Kubeconfig      string `json:"kubeconfig"`
	Namespace       string `json:"namespace"`
	Selector        string `json:"selector"`
	Pool            string `json:"pool"`
	MaxSandboxes    int    `json:"max_sandboxes"`
	PoolConcurrency int    `json:"pool_concurrency"`
	// ReplicaGroup and ReplicaID make it one replica of a group (roched --replica-group,
	// --replica-id); KubeQPS and KubeBurst are its --kube-qps and --kube-burst (0: the
	// provider's defaults).
	ReplicaGroup string  `json:"replica_group,omitempty"`
	ReplicaID    string  `json:"replica_id,omitempty"`
	KubeQPS      float32 `json:"kube_qps,omitempty"`
	KubeBurst    int     `json:"kube_burst,omitempty"`
}

func (c DaemonConfig) socket() string { return filepath.Join(c.Dir, "roched.sock") }
func (c DaemonConfig) counts() string { return filepath.Join(c.Dir, "counts.sock") }

// RunIfChild runs roched and exits when this process was started as the scale run's
// roched; otherwise it returns at once. Call it first in TestMain or main.
func RunIfChild() {
	js := os.Getenv(childEnv)
	if js == "" {
		return
	}
	if err := serveChild(js); err != nil {
		fmt.Fprintf(os.Stderr, "roched (scale run): %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func serveChild(js string) error {
	var cfg DaemonConfig
	if err := json.Unmarshal([]byte(js), &cfg); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	spec, err := pool.ParseSpec(cfg.Pool)
	if err != nil {
		return err
	}
	counter := newCounter()
	kp, err := kubernetes.New(kubernetes.WithLogger(log), kubernetes.WithKubeconfig(cfg.Kubeconfig),
		kubernetes.WithNamespace(cfg.Namespace), kubernetes.WithSimulatedNodes(cfg.Selector),
		kubernetes.WithTransportWrapper(counter.wrap), kubernetes.WithClientRate(cfg.KubeQPS, cfg.KubeBurst))
	if err != nil {
		return err
	}
	if err := kp.Available(); err != nil {
		return err
	}
	defer kp.Close()
	d, err := daemon.New(daemon.Config{
		Socket: cfg.socket(), Pools: []pool.Spec{spec},
		MaxSandboxes: cfg.MaxSandboxes, PoolConcurrency: cfg.PoolConcurrency,
		ReplicaGroup: cfg.ReplicaGroup, ReplicaID: cfg.ReplicaID,
	}, map[string]roche.Provider{kubernetes.Name: kp}, daemon.WithLogger(log))
	if err != nil {
		return err
	}
	cl, err := net.Listen("unix", cfg.counts())
	if err != nil {
		return err
	}
	defer cl.Close()
	mux := http.NewServeMux()
	mux.Handle("/counts", counter)
	mux.HandleFunc("/timings", counter.serveTimings)
	mux.HandleFunc("/gzipped", counter.serveGzipped)
	var prof profile
	mux.HandleFunc("/cpuprofile/start", prof.start)
	mux.HandleFunc("/cpuprofile/stop", prof.stop)
	go http.Serve(cl, mux)
	return d.ServeUntilSignal(2 * time.Minute)
}

// profile is the child's Go CPU profile, started and stopped by the run around a phase.
type profile struct {
	mu  sync.Mutex
	buf *bytes.Buffer
}

func (p *profile) start(w http.ResponseWriter, _ *http.Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.buf != nil {
		http.Error(w, "a profile is running", http.StatusConflict)
		return
	}
	p.buf = &bytes.Buffer{}
	if err := pprof.StartCPUProfile(p.buf); err != nil {
		p.buf = nil
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

func (p *profile) stop(w http.ResponseWriter, _ *http.Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.buf == nil {
		http.Error(w, "no profile is running", http.StatusConflict)
		return
	}
	pprof.StopCPUProfile()
	w.Write(p.buf.Bytes())
	p.buf = nil
}

// Roched is the child roched, seen from the scale run.
type Roched struct {
	cfg    DaemonConfig
	cmd    *exec.Cmd
	log    *lockedBuffer
	done   chan struct{}
	counts *http.Client
	// Client talks to it over its socket.
	Client *client.Client
	// Started is when the process was started; Ready when it first answered /healthz,
	// which it does once its ledger has reconciled with the cluster.
	Started, Ready time.Time
}

// StartRoched starts the child roched and waits until it answers.
func StartRoched(ctx context.Context, cfg DaemonConfig) (*Roched, error) {
	js, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	os.Remove(cfg.counts()) // a killed child's
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), childEnv+"="+string(js), "GOMEMLIMIT="+softMemoryLimit)
	r := &Roched{cfg: cfg, cmd: cmd, log: &lockedBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = r.log, r.log
	r.counts = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", cfg.counts())
	}}, Timeout: 10 * time.Second}
	r.Started = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { cmd.Wait(); close(r.done) }()
	c, err := client.New(client.WithSocket(cfg.socket()))
	if err != nil {
		r.Kill()
		return nil, err
	}
	r.Client = c
	deadline := time.Now().Add(3 * time.Minute)
	for {
		hctx, cancel := context.WithTimeout(ctx, time.Second)
		h, err := c.Health(hctx)
		cancel()
		if err == nil && h.PID == cmd.Process.Pid {
			r.Ready = time.Now()
			return r, nil
		}
		select {
		case <-r.done:
			return nil, fmt.Errorf("roched exited before it served: %s", r.log.tail(20))
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			r.Kill()
			return nil, fmt.Errorf("roched did not answer within 3 minutes: %v: %s", err, r.log.tail(20))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// PID is the child's process id.
func (r *Roched) PID() int { return r.cmd.Process.Pid }

// Kill ends roched with SIGKILL, as a crash would, and waits for it.
func (r *Roched) Kill() {
	r.cmd.Process.Signal(syscall.SIGKILL)
	<-r.done
	if r.Client != nil {
		r.Client.Close()
	}
}

// Stop shuts roched down (SIGTERM: it drains its pool) and waits for it.
func (r *Roched) Stop() error {
	r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(3 * time.Minute):
		r.Kill()
		return fmt.Errorf("roched did not stop within 3 minutes of SIGTERM")
	}
	if r.Client != nil {
		r.Client.Close()
	}
	if !r.cmd.ProcessState.Success() {
		return fmt.Errorf("roched's shutdown failed (%v): %s", r.cmd.ProcessState, r.log.tail(20))
	}
	return nil
}

// Log is the end of roched's log.
func (r *Roched) Log() string { return r.log.tail(30) }

// Memory is roched's resident set now and at its peak, in KiB (/proc/PID/status).
func (r *Roched) Memory() (rssKiB, peakKiB int, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", r.PID()))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(val), " kB"))
		switch key {
		case "VmRSS":
			rssKiB = n
		case "VmHWM":
			peakKiB = n
		}
	}
	return rssKiB, peakKiB, nil
}

// Requests is how many requests roched has sent the API server since it started, by
// "VERB resource" (counter.go).
func (r *Roched) Requests(ctx context.Context) (Counts, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://roched/counts", nil)
	if err != nil {
		return nil, err
	}
	resp, err := r.counts.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading roched's request counts: %w", err)
	}
	defer resp.Body.Close()
	var c Counts
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		return nil, fmt.Errorf("reading roched's request counts: %w", err)
	}
	return c, nil
}

// RoundTrips are the round trips of roched's requests named key ("patch pods"), from
// the from-th it sent on (counter.go).
func (r *Roched) RoundTrips(ctx context.Context, key string, from int) ([]time.Duration, error) {
	var ns []int64
	if err := r.get(ctx, "/timings?"+url.Values{"key": {key}, "from": {strconv.Itoa(from)}}.Encode(), func(b []byte) error { return json.Unmarshal(b, &ns) }); err != nil {
		return nil, fmt.Errorf("reading roched's round trips: %w", err)
	}
	out := make([]time.Duration, len(ns))
	for i, n := range ns {
		out[i] = time.Duration(n)
	}
	return out, nil
}

// Gzipped is how many of roched's answers from the API server came gzipped.
func (r *Roched) Gzipped(ctx context.Context) (int, error) {
	var n int
	err := r.get(ctx, "/gzipped", func(b []byte) error { return json.Unmarshal(b, &n) })
	return n, err
}

// StartProfile starts a Go CPU profile of roched; StopProfile ends it and returns it.
func (r *Roched) StartProfile(ctx context.Context) error {
	return r.get(ctx, "/cpuprofile/start", func([]byte) error { return nil })
}

func (r *Roched) StopProfile(ctx context.Context) ([]byte, error) {
	var out []byte
	err := r.get(ctx, "/cpuprofile/stop", func(b []byte) error { out = b; return nil })
	return out, err
}

func (r *Roched) get(ctx context.Context, path string, read func([]byte) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://roched"+path, nil)
	if err != nil {
		return err
	}
	resp, err := r.counts.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", path, resp.Status, strings.TrimSpace(string(b)))
	}
	return read(b)
}

// lockedBuffer is the child's output, written by two pipes' copiers at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) tail(lines int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	ls := strings.Split(strings.TrimSpace(b.b.String()), "\n")
	return strings.Join(ls[max(0, len(ls)-lines):], "\n")
}
