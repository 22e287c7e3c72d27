package daemon

import (
	"io"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/testcluster"
	"github.com/roche-sandbox/roche/provider/kit"
	"github.com/roche-sandbox/roche/provider/kubernetes"
)

// frontService is a stand-in for a Kubernetes Service in front of roched replicas: each
// connection goes to the first backend that accepts it.
func frontService(t *testing.T, socket string, backends ...string) {
	t.Helper()
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			var out net.Conn
			for _, b := range backends {
				if out, err = net.Dial("unix", b); err == nil {
					break
				}
			}
			if out == nil {
				in.Close()
				continue
			}
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(out, in); out.Close() }()
			go func() { defer wg.Done(); io.Copy(in, out); in.Close() }()
		}
	}()
}

// TestRochedReplicas runs two roched of one replica group on the test cluster, each
// with its own socket, state file and identity, and a Service-like proxy in front of
// them that prefers the first. A sandbox made through one is served and destroyed
// through the other; a create repeated with its idempotency key through the other
// answers with the first one's sandbox; the leader (the first) is killed -9 with a
// leased sandbox whose client had just gone, and another whose client holds it through
// the proxy: the second replica takes over the lead and reaps the first sandbox once,
// while the held one lives on, its Hold moved to the second replica.
func TestRochedReplicas(t *testing.T) {
	cluster := testcluster.Start(t)
	cl := cluster.Client(t)
	t.Cleanup(cl.Close)
	ns := cl.Namespace(t, "roche-daemon-replicas")
	importAgentImage(t)

	dir := shortDir(t)
	sockA, sockB, svc := filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock"), filepath.Join(dir, "svc.sock")
	args := func(id string) []string {
		return []string{"--state", filepath.Join(dir, id+".json"), "--kubeconfig", cluster.Kubeconfig, "--namespace", ns,
			"--providers", kubernetes.Name, "--replica-group", "g", "--replica-id", id, "--leader-lease", "4s"}
	}
	a := startRochedEnv(t, sockA, nil, args("replica-a")...)
	a.log.Await(t, "leading the replica group", nil, 30*time.Second)
	b := startRochedEnv(t, sockB, nil, args("replica-b")...)
	b.log.Await(t, "the replica group's leader", nil, 30*time.Second)
	frontService(t, svc, sockA, sockB)

	ctx := ctxFor(t, 4*time.Minute)
	newClient := func(socket string) *client.Client {
		c, err := client.New(client.WithSocket(socket))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	viaSvc, viaB := newClient(svc), newClient(sockB)
	pSvc, pB := viaSvc.Provider(kubernetes.Name), viaB.Provider(kubernetes.Name)
	cfg := pyConfig()
	cfg.TimeoutSecs = 180

	// Leased through B, by a client that goes at once: B lets the lease go, the agent
	// stops the sandbox its grace later, and the leader (A) alone reaps it, while B,
	// which made it and sweeps the group as often, leaves it.
	early := newClient(sockB)
	lost, _, err := early.CreateFor(ctx, kubernetes.Name, cfg, kit.CreateOptions{Leased: true})
	if err != nil {
		t.Fatal(err)
	}
	early.Close()

	// Made through A (the proxy's first), served and destroyed through B.
	keyed := kit.CreateOptions{IdempotencyKey: "job-42"}
	sb, _, err := viaSvc.CreateFor(ctx, kubernetes.Name, cfg, keyed)
	if err != nil {
		t.Fatal(err)
	}
	again, _, err := viaB.CreateFor(ctx, kubernetes.Name, cfg, keyed)
	if err != nil {
		t.Fatal(err)
	}
	if again.ID != sb.ID {
		t.Fatalf("a create repeated with its idempotency key through the other replica made %s, want the first one's %s", again.ID, sb.ID)
	}
	if again2, _, err := viaSvc.CreateFor(ctx, kubernetes.Name, cfg, keyed); err != nil || again2.ID != sb.ID {
		t.Fatalf("a create repeated with its idempotency key through the same replica: %s, %v; want %s", again2.ID, err, sb.ID)
	}
	if pods := k8sPods(t, cl, ns); len(pods) != 2 { // lost's and the key's
		t.Fatalf("%d Pods after three creates with one idempotency key and another create, want 2: %v", len(pods), pods)
	}
	if owner := k8sPods(t, cl, ns)[sb.ID].Metadata.Annotations[kubernetes.AnnotationOwner]; owner != "roched:replicas.g/"+LocalTenant {
		t.Errorf("the sandbox's owner is %q, want the group's for tenant %s", owner, LocalTenant)
	}
	res, err := pB.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "print(6 * 7)"}})
	if err != nil || strings.TrimSpace(res.Stdout) != "42" {
		t.Fatalf("exec through the replica that did not make it: %+v, %v\n%s", res, err, b.log)
	}
	list, err := pB.List(ctx)
	if err != nil || len(list) != 2 || !slices.ContainsFunc(list, func(s roche.SandboxInfo) bool { return s.ID == sb.ID }) {
		t.Fatalf("list through the other replica: %+v, %v", list, err)
	}
	if err := pB.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the sandbox destroyed through the other replica to be gone", func() bool {
		_, ok := k8sPods(t, cl, ns)[sb.ID]
		return !ok
	})

	eventually(t, 2*time.Minute, "the leader to reap the sandbox whose client went", func() bool {
		_, ok := k8sPods(t, cl, ns)[lost.ID]
		return !ok
	})
	if ra, rb := reapings(a.log.String(), lost.ID), reapings(b.log.String(), lost.ID); ra != 1 || rb != 0 {
		t.Errorf("the sandbox whose client went was reaped %d times by the leader and %d by the other replica, want once by the leader\nA:\n%s\nB:\n%s", ra, rb, a.log, b.log)
	}

	// held: leased, its client holds it through the proxy. dropped: leased, its client
	// (made straight to A) is gone. Both are A's leases when A is killed.
	held, _, err := viaSvc.CreateFor(ctx, kubernetes.Name, cfg, kit.CreateOptions{Leased: true})
	if err != nil {
		t.Fatal(err)
	}
	viaA := newClient(sockA)
	dropped, _, err := viaA.CreateFor(ctx, kubernetes.Name, cfg, kit.CreateOptions{Leased: true})
	if err != nil {
		t.Fatal(err)
	}
	viaA.Close() // its client goes: A lets its lease go HoldGrace later, or dies first
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	a.cmd.Wait()

	b.log.Await(t, "leading the replica group", nil, 30*time.Second)
	eventually(t, 2*time.Minute, "the new leader to reap the sandbox whose client and replica died", func() bool {
		_, ok := k8sPods(t, cl, ns)[dropped.ID]
		return !ok
	})
	if ra, rb := reapings(a.log.String(), dropped.ID), reapings(b.log.String(), dropped.ID); ra != 0 || rb != 1 {
		t.Errorf("the sandbox whose client and replica died was reaped %d times by the dead leader and %d by the new one, want once by the new one\nA:\n%s\nB:\n%s",
			ra, rb, a.log, b.log)
	}
	// held lost A's lease at the same moment: alive now, its Hold moved to B.
	if err := viaSvc.Holding(held.ID); err != nil {
		t.Errorf("the client's hold of %s ended: %v", held.ID, err)
	}
	res, err = pSvc.Exec(ctx, held.ID, roche.ExecRequest{Cmd: []string{"true"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec in the held sandbox after its replica died: %+v, %v\n%s", res, err, b.log)
	}
	if err := pSvc.Destroy(ctx, held.ID); err != nil {
		t.Fatal(err)
	}
	stopRoched(t, b)
	eventually(t, time.Minute, "no Pod left", func() bool { return len(k8sPods(t, cl, ns)) == 0 })
}

// reapings counts the lines of a replica's log that reap sandbox id.
func reapings(log, id string) int {
	n := 0
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "reaping a stopped") && strings.Contains(line, id) {
			n++
		}
	}
	return n
}
