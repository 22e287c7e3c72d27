package kubernetes

import (
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

// TestPodEnd: the sandbox container's status says which events a Pod's end is. The end
// itself is tested on the cluster (internal/daemon's TestOOMEndsKubernetes); this is
// the logic that tells an OOM kill of roche-agent from an OOMKilled kept from a
// command's, and a Pod that never ran.
func TestPodEnd(t *testing.T) {
	pod := func(phase corev1.PodPhase, name, reason string, code int32) *corev1.Pod {
		p := &corev1.Pod{Status: corev1.PodStatus{Phase: phase}}
		p.Name = "kubernetes-x"
		if name != "" {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: name, State: corev1.ContainerState{
				Terminated: &corev1.ContainerStateTerminated{Reason: reason, ExitCode: code},
			}}}
		}
		return p
	}
	gvisor := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.RuntimeClassName = ptr("gvisor")
		return p
	}
	for _, c := range []struct {
		name  string
		pod   *corev1.Pod
		kinds []kit.SandboxEventKind
		exit  int
	}{
		{"agent OOM-killed", pod(corev1.PodFailed, containerSandbox, "OOMKilled", 137), []kit.SandboxEventKind{kit.EventOOM, kit.EventDied}, 137},
		{"agent exited after a command's OOM kill", pod(corev1.PodFailed, containerSandbox, "OOMKilled", 2), []kit.SandboxEventKind{kit.EventDied}, 2},
		{"agent killed", pod(corev1.PodFailed, containerSandbox, "Error", 137), []kit.SandboxEventKind{kit.EventDied}, 137},
		{"gVisor sandbox OOM-killed", gvisor(pod(corev1.PodFailed, containerSandbox, "OOMKilled", 128)), []kit.SandboxEventKind{kit.EventOOM, kit.EventDied}, 128},
		{"gVisor sandbox killed", gvisor(pod(corev1.PodFailed, containerSandbox, "Error", 128)), []kit.SandboxEventKind{kit.EventDied}, 128},
		{"another container", pod(corev1.PodRunning, containerInstall, "Completed", 0), nil, 0},
		{"failed with no container status", pod(corev1.PodFailed, "", "", 0), []kit.SandboxEventKind{kit.EventDied}, 0},
		{"running", pod(corev1.PodRunning, "", "", 0), nil, 0},
	} {
		evs, ended := podEnd(c.pod)
		var kinds []kit.SandboxEventKind
		for _, ev := range evs {
			kinds = append(kinds, ev.Kind)
			if ev.ID != "kubernetes-x" || ev.Evidence == "" {
				t.Errorf("%s: event %+v, want the Pod's id and evidence", c.name, ev)
			}
			if ev.Kind == kit.EventDied && c.pod.Status.ContainerStatuses != nil && (!ev.ExitKnown || ev.ExitCode != c.exit) {
				t.Errorf("%s: died with %+v, want exit %d", c.name, ev, c.exit)
			}
		}
		if ended != (len(c.kinds) > 0) || len(kinds) != len(c.kinds) {
			t.Errorf("%s: events %v ended %v, want %v", c.name, kinds, ended, c.kinds)
			continue
		}
		for i := range kinds {
			if kinds[i] != c.kinds[i] {
				t.Errorf("%s: events %v, want %v", c.name, kinds, c.kinds)
			}
		}
	}
}

// TestPodEndReason: what an exec that lost its sandbox says of why it ended (awaitEnd),
// read from the same status: an OOM kill of roche-agent (on gVisor, of the whole
// sandbox), its lifetime, another exit, or nothing known.
func TestPodEndReason(t *testing.T) {
	expires := time.Unix(1700000000, 0)
	pod := func(reason string, code int32, finished time.Time) *corev1.Pod {
		p := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed}}
		p.Name = "kubernetes-x"
		p.Labels = map[string]string{LabelExpires: strconv.FormatInt(expires.Unix(), 10)}
		if reason != "" {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerSandbox, State: corev1.ContainerState{
				Terminated: &corev1.ContainerStateTerminated{Reason: reason, ExitCode: code, FinishedAt: metav1.NewTime(finished)},
			}}}
		}
		return p
	}
	early := expires.Add(-time.Minute)
	for _, c := range []struct {
		name string
		pod  *corev1.Pod
		want roche.EndKind
	}{
		{"OOM", pod("OOMKilled", 137, early), roche.EndOOM},
		{"lifetime", pod("Completed", 0, expires), roche.EndLifetime},
		{"agent killed", pod("Error", 137, early), roche.EndAgentExited},
		{"no container status", pod("", 0, early), ""},
	} {
		got := podEndReason(c.pod)
		switch {
		case c.want == "" && got != nil:
			t.Errorf("%s: %v, want nothing known", c.name, got)
		case c.want != "" && (got == nil || got.Kind != c.want || got.Evidence == "" || !got.ExitKnown):
			t.Errorf("%s: %v, want %s with the container status as evidence", c.name, got, c.want)
		}
	}
	if podEnded(pod("", 0, early)) != true || podEndReason(&corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning}}) != nil {
		t.Error("a Failed Pod is ended, a running one has no end")
	}
}
