package deploy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/informers"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"

	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/kubernetes"
)

// replicaClients is how many clients loop through the Service at once.
const replicaClients = 10

// TestRochedReplicasInCluster: the Deployment with the replicas overlay of
// docs/roched-in-a-cluster.md (3 replicas of one group), behind its Service; 10 clients
// of the Python SDK (clients.py) loop create, exec, a background command and destroy
// through the Service, and an eleventh keeps one sandbox through the whole run. Mid-run
// one replica's Pod is deleted (SIGTERM, as a rollout or a drained node does) and, once
// its replacement is ready, the leader's roched is killed with SIGKILL on the node (its
// container's process, by pid: a crash, not a deletion). Every call must succeed after
// the SDK's retries, every background command's output must be whole, no sandbox's Pod
// may end before its client destroys it, every Pod must be one a client was given, and
// none may be left when the clients stop.
func TestRochedReplicasInCluster(t *testing.T) {
	testenv.Needs(t, testenv.Cluster, testenv.Python)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	d := deploy(ctx, t, replicasPatch(t))
	if len(d.pods) != 3 {
		t.Fatalf("the replicas overlay runs %d roched Pods, want 3", len(d.pods))
	}
	svc := startService(ctx, t, d, "roched")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("connections the Service reset:\n%s", svc.resetsSeen())
		}
	})
	sandboxes := watchSandboxes(ctx, t, d.cs, d.ns)
	run := startClients(ctx, t, svc.addr, d.token, replicaClients)
	start := time.Now()

	// One replica, not the leader, is deleted once the clients are well under way.
	run.await(t, 8)
	leader := leaderPod(ctx, t, d)
	var deleted string
	for _, p := range d.pods {
		if p.Name != leader.Name {
			deleted = p.Name
			break
		}
	}
	open := svc.openTo(deleted)
	if err := d.cs.CoreV1().Pods(d.ns).Delete(ctx, deleted, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("%.1f s: replica %s deleted with %d client connections open to it (%d sandboxes done)", time.Since(start).Seconds(), deleted, open, run.done())
	if open == 0 {
		t.Errorf("replica %s was deleted with no client connection open to it: the test proves nothing of its loss", deleted)
	}
	waitRoched(ctx, t, d.cs, d.ns, deleted)
	t.Logf("%.1f s: its replacement is ready", time.Since(start).Seconds())

	// Then the leader's roched is killed outright.
	run.await(t, run.done()+8)
	leader = leaderPod(ctx, t, d)
	if len(leader.Status.ContainerStatuses) != 1 {
		t.Fatalf("roched's Pod %s has %d containers", leader.Name, len(leader.Status.ContainerStatuses))
	}
	before := leader.Status.ContainerStatuses[0].RestartCount
	pid, err := d.cluster.ContainerPID(leader.Status.ContainerStatuses[0].ContainerID)
	if err != nil {
		t.Fatal(err)
	}
	if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err != nil || !strings.HasPrefix(string(cmdline), kubernetes.RochedBin+"\x00") {
		t.Fatalf("pid %d of roched's container is %q (%v), not roched", pid, cmdline, err)
	}
	open = svc.openTo(leader.Name)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	t.Logf("%.1f s: the leader, %s, killed -9 (pid %d) with %d client connections open to it (%d sandboxes done)",
		time.Since(start).Seconds(), leader.Name, pid, open, run.done())
	if open == 0 {
		t.Errorf("the leader %s was killed with no client connection open to it: the test proves nothing of its loss", leader.Name)
	}

	// The clients go on for about 25 s, past the leader lease and the lease grace of the
	// Holds the dead replica served (15 s each), then stop.
	run.await(t, run.done()+14)
	run.stop(t)
	t.Logf("%.1f s: the clients stopped: %d sandboxes made, used and destroyed, the keeper's used %d times; connections by replica %v, not taken %v",
		time.Since(start).Seconds(), run.done(), run.kept(), svc.servedBy(), svc.notTaken())

	// The kill was a crash of the process, restarted by the kubelet in the same Pod.
	p, err := d.cs.CoreV1().Pods(d.ns).Get(ctx, leader.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Status.ContainerStatuses[0].RestartCount; got != before+1 {
		t.Errorf("roched's container in %s restarted %d times after the kill, want once", leader.Name, got-before)
	}
	// Every replica, the ones that came after the loss included, served connections.
	for _, p := range readyPods(ctx, d.cs, d.ns, "") {
		if svc.servedBy()[p.Name] == 0 {
			t.Errorf("the Service sent no connection to replica %s (%v)", p.Name, svc.servedBy())
		}
	}

	sandboxes.check(t, run)
	testenv.Eventually(t, 60*time.Second, "no sandbox Pod left after the clients stopped", func() bool {
		pods, err := d.cs.CoreV1().Pods(d.ns).List(ctx, metav1.ListOptions{LabelSelector: kubernetes.LabelManaged + "=true"})
		return err == nil && len(pods.Items) == 0
	})
	for _, p := range readyPods(ctx, d.cs, d.ns, "") {
		for _, previous := range []bool{false, true} {
			if previous && p.Name != leader.Name {
				continue
			}
			logs, err := d.cs.CoreV1().Pods(d.ns).GetLogs(p.Name, &corev1.PodLogOptions{Previous: previous}).DoRaw(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(strings.ToLower(string(logs)), "forbidden") {
				t.Errorf("replica %s was refused a call; its Role lacks something:\n%s", p.Name, logs)
			}
		}
	}
}

// replicasPatch is the overlay's patch for replicas, as docs/roched-in-a-cluster.md shows
// it (the first yaml block of its "Replicas" section), so that the page's is the one
// tested.
func replicasPatch(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "roched-in-a-cluster.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(doc), "\n## Replicas\n")
	_, block, ok := strings.Cut(section, "```yaml\n")
	block, _, closed := strings.Cut(block, "```")
	if !ok || !closed || !strings.HasPrefix(block, "patches:") {
		t.Fatal(`docs/roched-in-a-cluster.md's "Replicas" section has no yaml block of patches`)
	}
	return block
}

// leaderPod is the replica that holds the group's Lease (roched-GROUP; its holder is the
// replica's host name, its Pod's name, and its state's instance).
func leaderPod(ctx context.Context, t *testing.T, d *deployed) *corev1.Pod {
	t.Helper()
	lease, err := d.cs.CoordinationV1().Leases(d.ns).Get(ctx, "roched-roched", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the replica group's Lease: %v", err)
	}
	holder := ""
	if lease.Spec.HolderIdentity != nil {
		holder = *lease.Spec.HolderIdentity
	}
	for _, p := range readyPods(ctx, d.cs, d.ns, "") {
		if strings.HasPrefix(holder, p.Name+"-") {
			return p
		}
	}
	t.Fatalf("the Lease's holder %q is none of roched's ready Pods%s", holder, describePods(d.cs, d.ns))
	return nil
}

// service is a Service's address for clients on this host, routed as kube-proxy would
// route it (the test cluster has none, and the host no route into the Pod network): each
// connection to it goes to the next of the Service's ready endpoints (its EndpointSlices,
// watched), through a port-forward of the API server to that endpoint's Pod. A
// connection to a Pod that no longer listens is reset, as a connection to a dead
// endpoint is before the endpoint controller drops it.
type service struct {
	addr   string
	cfg    *deployed
	name   string
	slices cache.Store

	mu      sync.Mutex
	turn    int
	tunnels map[string]httpstream.Connection // by Pod
	served  map[string]int                   // connections sent to each Pod
	refused map[string]int                   // of those, the ones it did not take (or broke)
	open    map[string]int                   // connections open to each Pod now
	resets  []string                         // why connections were reset, for a failure
	started time.Time
	reqID   int
}

func startService(ctx context.Context, t *testing.T, d *deployed, name string) *service {
	t.Helper()
	stop := make(chan struct{})
	f := informers.NewSharedInformerFactoryWithOptions(d.cs, 0, informers.WithNamespace(d.ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = discoveryv1.LabelServiceName + "=" + name }))
	inf := f.Discovery().V1().EndpointSlices().Informer()
	f.Start(stop)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		close(stop)
		t.Fatal("watching the Service's EndpointSlices: no answer")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		close(stop)
		t.Fatal(err)
	}
	s := &service{addr: "http://" + ln.Addr().String(), cfg: d, name: name, slices: inf.GetStore(),
		tunnels: map[string]httpstream.Connection{}, served: map[string]int{}, refused: map[string]int{}, open: map[string]int{}, started: time.Now()}
	var wg sync.WaitGroup
	var open sync.Map // the clients' connections, closed at the end
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			open.Store(in, true)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer open.Delete(in)
				s.serve(t, in)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		open.Range(func(c, _ any) bool { c.(net.Conn).Close(); return true })
		s.mu.Lock()
		for _, c := range s.tunnels {
			c.Close()
		}
		s.mu.Unlock()
		wg.Wait()
		close(stop)
	})
	return s
}

// endpoint is a ready endpoint of the Service: its Pod and port.
type endpoint struct {
	pod  string
	port int32
}

// next picks the next ready endpoint in turn.
func (s *service) next() (endpoint, bool) {
	var eps []endpoint
	for _, o := range s.slices.List() {
		sl := o.(*discoveryv1.EndpointSlice)
		if len(sl.Ports) != 1 || sl.Ports[0].Port == nil {
			continue
		}
		for _, e := range sl.Endpoints {
			if e.Conditions.Ready != nil && *e.Conditions.Ready && e.TargetRef != nil && e.TargetRef.Kind == "Pod" {
				eps = append(eps, endpoint{e.TargetRef.Name, *sl.Ports[0].Port})
			}
		}
	}
	if len(eps) == 0 {
		return endpoint{}, false
	}
	slices.SortFunc(eps, func(a, b endpoint) int { return strings.Compare(a.pod, b.pod) })
	s.mu.Lock()
	defer s.mu.Unlock()
	s.turn++
	return eps[s.turn%len(eps)], true
}

// tunnel is the port-forward connection to a Pod, made again once it has closed.
func (s *service) tunnel(pod string) (httpstream.Connection, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.tunnels[pod]; ok {
		select {
		case <-c.CloseChan():
		default:
			return c, nil
		}
	}
	transport, upgrader, err := spdy.RoundTripperFor(s.cfg.cfg)
	if err != nil {
		return nil, err
	}
	url := s.cfg.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(s.cfg.ns).Name(pod).SubResource("portforward").URL()
	c, _, err := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, url).Dial(portforward.PortForwardProtocolV1Name)
	if err != nil {
		return nil, err
	}
	s.tunnels[pod] = c
	return c, nil
}

// drop closes a Pod's port-forward connection c, unless another has replaced it.
func (s *service) drop(pod string, c httpstream.Connection) {
	s.mu.Lock()
	if s.tunnels[pod] == c {
		delete(s.tunnels, pod)
	}
	s.mu.Unlock()
	c.Close()
}

// serve carries one client connection to an endpoint, as client-go's port-forward does
// (an error stream and a data stream per connection).
func (s *service) serve(t *testing.T, in net.Conn) {
	var why string
	reset := func() {
		s.mu.Lock()
		s.resets = append(s.resets, fmt.Sprintf("%.1f s: %s", time.Since(s.started).Seconds(), why))
		s.mu.Unlock()
		if tc, ok := in.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		in.Close()
	}
	ep, ok := s.next()
	if !ok {
		why = "no ready endpoint"
		reset()
		return
	}
	c, err := s.tunnel(ep.pod)
	if err != nil {
		why = fmt.Sprintf("port-forward to %s: %v", ep.pod, err)
		s.count(s.refused, ep.pod)
		reset()
		return
	}
	s.mu.Lock()
	s.reqID++
	id := s.reqID
	s.mu.Unlock()
	h := http.Header{}
	h.Set(corev1.StreamType, corev1.StreamTypeError)
	h.Set(corev1.PortHeader, strconv.Itoa(int(ep.port)))
	h.Set(corev1.PortForwardRequestIDHeader, strconv.Itoa(id))
	errStream, err := c.CreateStream(h)
	if err != nil {
		why = fmt.Sprintf("error stream to %s: %v", ep.pod, err)
		s.drop(ep.pod, c)
		s.count(s.refused, ep.pod)
		reset()
		return
	}
	errStream.Close() // nothing is written to it
	h.Set(corev1.StreamType, corev1.StreamTypeData)
	data, err := c.CreateStream(h)
	if err != nil {
		why = fmt.Sprintf("data stream to %s: %v", ep.pod, err)
		s.drop(ep.pod, c)
		c.RemoveStreams(errStream)
		s.count(s.refused, ep.pod)
		reset()
		return
	}
	defer c.RemoveStreams(errStream, data)
	s.count(s.served, ep.pod)
	s.count(s.open, ep.pod)
	defer func() {
		s.mu.Lock()
		s.open[ep.pod]--
		s.mu.Unlock()
	}()
	failed := make(chan string, 1)
	go func() {
		msg, err := io.ReadAll(errStream)
		switch {
		case err != nil:
			failed <- err.Error()
		default:
			failed <- string(msg)
		}
	}()
	remoteDone, localDone := make(chan struct{}), make(chan struct{})
	go func() { io.Copy(in, data); close(remoteDone) }()
	go func() { io.Copy(data, in); data.Close(); close(localDone) }()
	select {
	case <-remoteDone:
	case <-localDone:
	}
	if msg := <-failed; msg != "" {
		why = fmt.Sprintf("%s: %s", ep.pod, msg)
		// The kubelet takes no more streams on a port-forward that failed once (as
		// client-go's port-forward, which ends there): the next connection makes another.
		s.drop(ep.pod, c)
		s.count(s.refused, ep.pod)
		reset()
	} else {
		in.Close()
	}
	data.Reset()
	<-remoteDone
	<-localDone
}

func (s *service) count(m map[string]int, pod string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m[pod]++
}

// openTo is how many connections are open to a Pod.
func (s *service) openTo(pod string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.open[pod]
}

// resetsSeen are the resets so far, why and when.
func (s *service) resetsSeen() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.resets, "\n")
}

func (s *service) servedBy() map[string]int { return s.snapshot(s.served) }
func (s *service) notTaken() map[string]int { return s.snapshot(s.refused) }

func (s *service) snapshot(m map[string]int) map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// clientEvent is a line of clients.py.
type clientEvent struct {
	Ev     string `json:"ev"`
	Client any    `json:"client"`
	ID     string `json:"id"`
	Error  string `json:"error"`
}

// clients is clients.py running; its lines are read as they come.
type clients struct {
	cmd    *exec.Cmd
	stdin  io.Closer
	stderr *testenv.SyncBuffer
	exited chan struct{}

	mu         sync.Mutex
	changed    chan struct{}
	destroyed  int
	used       int
	created    map[string]time.Time // by sandbox, when the test read its line
	destroying map[string]time.Time
	failures   []string
}

func startClients(ctx context.Context, t *testing.T, addr, token string, n int) *clients {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Fatal("python3 not found: the Python SDK's check needs Python 3.10+ (scripts/test.sh installs it)")
	}
	sdk, err := filepath.Abs(filepath.Join("..", "..", "sdk", "python", "src"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "python3", "clients.py", addr, testenv.Image(), strconv.Itoa(n))
	cmd.Env = append(os.Environ(), "PYTHONPATH="+sdk, "ROCHE_TOKEN="+token)
	r := &clients{cmd: cmd, stderr: &testenv.SyncBuffer{}, exited: make(chan struct{}), changed: make(chan struct{}),
		created: map[string]time.Time{}, destroying: map[string]time.Time{}}
	cmd.Stderr = r.stderr
	if r.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		lines := bufio.NewScanner(stdout)
		lines.Buffer(nil, 1<<20)
		for lines.Scan() {
			var ev clientEvent
			if err := json.Unmarshal(lines.Bytes(), &ev); err != nil {
				r.note(func() { r.failures = append(r.failures, "clients.py printed "+lines.Text()) })
				continue
			}
			now := time.Now()
			r.note(func() {
				switch ev.Ev {
				case "created":
					r.created[ev.ID] = now
				case "destroying":
					r.destroying[ev.ID] = now
				case "destroyed":
					r.destroyed++
				case "used":
					r.used++
				case "failed":
					r.failures = append(r.failures, fmt.Sprintf("client %v: %s", ev.Client, ev.Error))
				}
			})
		}
		cmd.Wait()
		close(r.exited)
		r.note(func() {})
	}()
	t.Cleanup(func() {
		r.stdin.Close()
		select {
		case <-r.exited:
		case <-time.After(2 * time.Minute):
			cmd.Process.Kill()
			<-r.exited
		}
	})
	return r
}

func (r *clients) note(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f()
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *clients) done() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.destroyed
}

func (r *clients) kept() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.used
}

// await waits until the clients have destroyed n sandboxes; it fails when a client
// failed or they all stopped first.
func (r *clients) await(t *testing.T, n int) {
	t.Helper()
	timeout := time.After(2 * time.Minute)
	for {
		r.mu.Lock()
		done, failures, changed := r.destroyed, slices.Clone(r.failures), r.changed
		r.mu.Unlock()
		if len(failures) > 0 {
			t.Fatalf("a client's call failed:\n%s", strings.Join(failures, "\n"))
		}
		if done >= n {
			return
		}
		select {
		case <-r.exited:
			t.Fatalf("the clients stopped after %d sandboxes, before %d: %v\n%s", done, n, r.cmd.ProcessState, r.stderr.String())
		case <-timeout:
			t.Fatalf("the clients destroyed %d sandboxes in 2 minutes, not %d", done, n)
		case <-changed:
		}
	}
}

// stop tells the clients to finish the iteration under way and waits for them.
func (r *clients) stop(t *testing.T) {
	t.Helper()
	r.stdin.Close()
	select {
	case <-r.exited:
	case <-time.After(2 * time.Minute):
		t.Fatal("the clients did not stop within 2 minutes of being told to")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.failures) > 0 || !r.cmd.ProcessState.Success() {
		t.Fatalf("the clients ended %v:\n%s\n%s", r.cmd.ProcessState, strings.Join(r.failures, "\n"), r.stderr.String())
	}
}

// sandboxPods follows the sandboxes' Pods from outside roched: when each was first seen,
// and when and how it first ended (deleted, or its container stopped).
type sandboxPods struct {
	mu    sync.Mutex
	seen  map[string]bool
	ended map[string]time.Time
	how   map[string]string
}

func watchSandboxes(ctx context.Context, t *testing.T, cs k8s.Interface, ns string) *sandboxPods {
	t.Helper()
	w := &sandboxPods{seen: map[string]bool{}, ended: map[string]time.Time{}, how: map[string]string{}}
	stop := make(chan struct{})
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = kubernetes.LabelManaged + "=true" }))
	inf := f.Core().V1().Pods().Informer()
	look := func(obj any, gone bool) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		how := ""
		switch {
		case gone:
			how = "deleted"
		case p.DeletionTimestamp != nil:
			how = "being deleted"
		case p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed:
			how = "phase " + string(p.Status.Phase)
		}
		for _, c := range p.Status.ContainerStatuses {
			if how == "" && c.State.Terminated != nil {
				how = fmt.Sprintf("container %s %s (exit %d)", c.Name, c.State.Terminated.Reason, c.State.Terminated.ExitCode)
			}
		}
		now := time.Now()
		w.mu.Lock()
		defer w.mu.Unlock()
		w.seen[p.Name] = true
		if _, ended := w.ended[p.Name]; how != "" && !ended {
			w.ended[p.Name], w.how[p.Name] = now, how
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { look(obj, false) },
		UpdateFunc: func(_, obj any) { look(obj, false) },
		DeleteFunc: func(obj any) { look(obj, true) },
	}); err != nil {
		t.Fatal(err)
	}
	f.Start(stop)
	t.Cleanup(func() { close(stop) })
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("watching the sandboxes' Pods: no answer")
	}
	return w
}

// check: every sandbox Pod seen is one a client was given, and none ended before its
// client set about destroying it (the client writes that line before its call).
func (w *sandboxPods) check(t *testing.T, r *clients) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range w.seen {
		if _, ok := r.created[id]; !ok {
			t.Errorf("sandbox Pod %s was given to no client (a create made twice?)", id)
		}
	}
	for id := range r.created {
		if !w.seen[id] {
			t.Errorf("sandbox %s, given to a client, was never seen as a Pod", id)
		}
		end, ended := w.ended[id]
		asked, destroyed := r.destroying[id]
		switch {
		case ended && !destroyed:
			t.Errorf("sandbox %s ended (%s) and its client never destroyed it", id, w.how[id])
		case ended && end.Before(asked):
			t.Errorf("sandbox %s ended (%s) %v before its client destroyed it", id, w.how[id], asked.Sub(end))
		}
	}
}
