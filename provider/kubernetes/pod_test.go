package kubernetes

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest/podlink"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Unit tests of the mapping alone; what the cluster makes of it is tested against the
// real test cluster (kubernetes_test.go).

func testParams() podParams {
	return podParams{
		id: "kubernetes-0123456789abcdef", namespace: "ns", agentImage: "roche/agent:x",
		user: "1900000005:1900000005", uid: 1900000005, expires: time.Unix(1700000000, 0),
		seccomp: DefaultSeccompProfile,
	}
}

func TestPodForSecureDefaults(t *testing.T) {
	cfg := roche.DefaultConfig()
	cfg.Image = "roche/python:local"
	pod, err := podFor(kit.Spec{Config: cfg, CreateOptions: kit.CreateOptions{Owner: "cli:root@host"}}, testParams())
	if err != nil {
		t.Fatal(err)
	}
	s := pod.Spec
	if *s.AutomountServiceAccountToken || *s.EnableServiceLinks || s.HostNetwork || s.HostPID || s.HostIPC || *s.ShareProcessNamespace {
		t.Errorf("pod spec shares the host or the service account: %+v", s)
	}
	if s.RestartPolicy != corev1.RestartPolicyNever || *s.ActiveDeadlineSeconds != 300 || s.RuntimeClassName != nil {
		t.Errorf("restart %s, deadline %d, runtime class %v", s.RestartPolicy, *s.ActiveDeadlineSeconds, s.RuntimeClassName)
	}
	// Roche's profile on both containers; the runtime's own on the Pod's sandbox, which
	// runs nothing of the sandbox's.
	if s.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod seccomp %+v", s.SecurityContext.SeccompProfile)
	}
	for _, c := range append(slices.Clone(s.InitContainers), s.Containers...) {
		if sp := c.SecurityContext.SeccompProfile; sp == nil || sp.Type != corev1.SeccompProfileTypeLocalhost || *sp.LocalhostProfile != "roche.json" {
			t.Errorf("container %s seccomp %+v, want Localhost roche.json", c.Name, sp)
		}
	}
	want := map[string]string{
		LabelManaged: "true", LabelProvider: "kubernetes", LabelNetwork: "none",
		LabelExpires: "1700000000", LabelUID: "1900000005", LabelSandbox: "kubernetes-0123456789abcdef",
	}
	for k, v := range want {
		if pod.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, pod.Labels[k], v)
		}
	}
	if pod.Annotations[AnnotationOwner] != "cli:root@host" || configOf(pod).Image != "roche/python:local" {
		t.Errorf("annotations %v", pod.Annotations)
	}
	c := s.Containers[0]
	if c.TerminationMessagePath != podlink.TerminationLog || !strings.HasPrefix(c.TerminationMessagePath, podlink.RunDir+"/") {
		t.Errorf("termination message path %q, want one in the agent's own directory", c.TerminationMessagePath)
	}
	sc := c.SecurityContext
	if !*sc.ReadOnlyRootFilesystem || *sc.AllowPrivilegeEscalation || *sc.Privileged {
		t.Errorf("container security context %+v", sc)
	}
	if !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || !slices.Equal(sc.Capabilities.Add, agentCaps) {
		t.Errorf("capabilities %+v", sc.Capabilities)
	}
	if c.Command[0] != podlink.Agent || !strings.Contains(strings.Join(c.Command, " "), "--user 1900000005:1900000005 --lifetime 300s --owner 0 --nproc 64") {
		t.Errorf("command %q", c.Command)
	}
	lim := c.Resources.Limits
	if lim.Cpu().MilliValue() != 1000 || lim.Memory().Value() != 512<<20 {
		t.Errorf("limits %v", lim)
	}
	if _, ok := lim[corev1.ResourceEphemeralStorage]; ok {
		t.Errorf("a read-only root got an ephemeral-storage limit: %v", lim)
	}
	if c.Resources.Requests.Cpu().Cmp(*lim.Cpu()) > 0 || c.Resources.Requests.Memory().Cmp(*lim.Memory()) > 0 {
		t.Errorf("requests %v above limits %v", c.Resources.Requests, lim)
	}
	var tmp *corev1.EmptyDirVolumeSource
	for _, v := range s.Volumes {
		if v.Name == volumeTmp {
			tmp = v.EmptyDir
		}
	}
	if tmp == nil || tmp.Medium != corev1.StorageMediumMemory || tmp.SizeLimit.Value() != roche.DefaultTmpSize {
		t.Errorf("/tmp volume %+v, want a 64 MiB tmpfs", tmp)
	}
	ic := s.InitContainers[0]
	if ic.Image != "roche/agent:x" || len(ic.SecurityContext.Capabilities.Add) != 0 || !*ic.SecurityContext.ReadOnlyRootFilesystem {
		t.Errorf("init container %+v", ic)
	}
}

func TestPodForOverrides(t *testing.T) {
	cfg := roche.DefaultConfig()
	cfg.Network, cfg.Writable, cfg.Disk = true, true, "0"
	cfg.CPUs, cfg.Memory, cfg.PidsLimit, cfg.TimeoutSecs = 0.25, "1g", 20, 60
	cfg.Env = map[string]string{"B": "2", "A": "1", "HOME": "/work"}
	pp := testParams()
	pp.runtimeClass, pp.seccomp = "gvisor", SeccompRuntimeDefault
	pod, err := podFor(kit.Spec{Config: cfg}, pp)
	if err != nil {
		t.Fatal(err)
	}
	c := pod.Spec.Containers[0]
	if pod.Labels[LabelNetwork] != NetworkOn || *c.SecurityContext.ReadOnlyRootFilesystem {
		t.Errorf("network label %q, read-only %v", pod.Labels[LabelNetwork], *c.SecurityContext.ReadOnlyRootFilesystem)
	}
	if sp := c.SecurityContext.SeccompProfile; *pod.Spec.RuntimeClassName != "gvisor" || sp.Type != corev1.SeccompProfileTypeRuntimeDefault || sp.LocalhostProfile != nil {
		t.Errorf("runtime class %v, seccomp %+v", pod.Spec.RuntimeClassName, sp)
	}
	if c.Resources.Limits.Cpu().MilliValue() != 250 || c.Resources.Limits.Memory().Value() != 1<<30 || *pod.Spec.ActiveDeadlineSeconds != 60 {
		t.Errorf("limits %v, deadline %d", c.Resources.Limits, *pod.Spec.ActiveDeadlineSeconds)
	}
	if got := c.Env; len(got) != 3 || got[0].Name != "A" || got[2].Name != "HOME" || got[2].Value != "/work" {
		t.Errorf("env %v, want sorted, HOME as given", got)
	}
	if !strings.Contains(strings.Join(c.Command, " "), "--nproc 20") {
		t.Errorf("command %q", c.Command)
	}
}

func TestNetworkPolicyDeniesAll(t *testing.T) {
	pol := networkPolicyFor("kubernetes-x", "ns")
	if len(pol.Spec.Ingress) != 0 || len(pol.Spec.Egress) != 0 || len(pol.Spec.PolicyTypes) != 2 {
		t.Fatalf("policy %+v is not deny-all both ways", pol.Spec)
	}
	if pol.Spec.PodSelector.MatchLabels[LabelSandbox] != "kubernetes-x" {
		t.Fatalf("policy selects %v, want the sandbox's Pod alone", pol.Spec.PodSelector.MatchLabels)
	}
}

// TestRefusedCreateMakesNothing: what the provider cannot honour is refused, naming the
// field, before any object is made.
func TestRefusedCreateMakesNothing(t *testing.T) {
	cs := fake.NewClientset()
	p, err := New(WithClientset(cs, nil), WithAgentImage("roche/agent:x"), WithNamespace("ns"))
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(*roche.Config){
		"network_allowlist": func(c *roche.Config) { c.NetworkAllowlist = []string{"example.com"} },
		"mounts":            func(c *roche.Config) { c.Mounts = []roche.Mount{{Source: "/etc", Target: "/x"}} },
		"from_snapshot":     func(c *roche.Config) { c.FromSnapshot = "s" },
		"disk":              func(c *roche.Config) { c.Writable = true },
	}
	for field, mod := range cases {
		cfg := roche.DefaultConfig()
		mod(&cfg)
		_, err := p.Create(context.Background(), cfg)
		if !errors.Is(err, roche.ErrUnsupported) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v, want ErrUnsupported naming it", field, err)
		}
	}
	if n := len(cs.Actions()); n != 0 {
		t.Fatalf("refused creates made %d API calls: %v", n, cs.Actions())
	}
}

// TestNamespaceMadeWhenMissing: the namespace is made once, labelled as Roche's.
func TestNamespaceMadeWhenMissing(t *testing.T) {
	cs := fake.NewClientset()
	p, err := New(WithClientset(cs, nil), WithAgentImage("roche/agent:x"), WithNamespace("sandboxes"))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := p.ensureNamespace(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	ns, err := cs.CoreV1().Namespaces().Get(context.Background(), "sandboxes", metav1.GetOptions{})
	if err != nil || ns.Labels[LabelManaged] != "true" {
		t.Fatalf("namespace %+v, %v", ns, err)
	}
	creates := 0
	for _, a := range cs.Actions() {
		if a.GetVerb() == "create" {
			creates++
		}
	}
	if creates != 1 {
		t.Fatalf("%d creates, want 1", creates)
	}
}

func TestBadOptionsRefused(t *testing.T) {
	for name, opt := range map[string]Option{
		"namespace":       WithNamespace("Not_A_Name"),
		"runtime class":   WithRuntimeClass("bad/class"),
		"seccomp profile": WithSeccompProfile("/etc/abs.json"),
		"create timeout":  WithCreateTimeout(0),
		"uid range":       WithUIDRange(0, 10),
		"client rate":     WithClientRate(-1, 0),
		"client burst":    WithClientRate(10, -5),
	} {
		if _, err := New(WithClientset(fake.NewClientset(), nil), opt); !errors.Is(err, roche.ErrInvalidConfig) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line wrapping ErrInvalidConfig", name, err)
		}
	}
}

// TestClaimRelabels: a claim is one patch giving the Pod its holder, its end and a
// deadline counted from its start; an end past the one it was made with is refused
// without a call.
func TestClaimRelabels(t *testing.T) {
	started := time.Now().Add(-90 * time.Second).Truncate(time.Second)
	pp := testParams()
	pp.expires = started.Add(660 * time.Second)
	cfg := roche.DefaultConfig()
	cfg.TimeoutSecs = 660
	pod, err := podFor(kit.Spec{Config: cfg}, pp)
	if err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, StartTime: &metav1.Time{Time: started}}
	cs := fake.NewClientset(pod)
	p, err := New(WithClientset(cs, nil), WithAgentImage("roche/agent:x"), WithNamespace("ns"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := p.Claim(ctx, pp.id, kit.Claim{Owner: "roched:a.b/t", Expires: pp.expires.Add(time.Second)}); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Errorf("a claim past the Pod's end: %v, want ErrInvalidConfig", err)
	}
	calls := len(cs.Actions())
	expires := time.Now().Add(120 * time.Second)
	held := kit.Claim{Owner: "roched:a.b/t", Expires: expires, Env: map[string]string{"K": "v"}, Workdir: "/tmp/w"}
	if err := p.Claim(ctx, pp.id, held); err != nil {
		t.Fatal(err)
	}
	var patches int
	for _, a := range cs.Actions()[calls:] {
		if a.GetVerb() == "patch" {
			patches++
		}
	}
	if patches != 1 {
		t.Errorf("%d patches for a claim, want 1: %v", patches, cs.Actions()[calls:])
	}
	got, err := cs.CoreV1().Pods("ns").Get(ctx, pp.id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Annotations[AnnotationOwner] != "roched:a.b/t" || expiresOf(got.Labels).Unix() != expires.Unix() {
		t.Errorf("owner %q, expires %v after the claim", got.Annotations[AnnotationOwner], expiresOf(got.Labels))
	}
	// 90 s since the start plus the client's 120 s, rounded up.
	if d := *got.Spec.ActiveDeadlineSeconds; d < 210 || d > 212 {
		t.Errorf("activeDeadlineSeconds %d after the claim, want about 210", d)
	}
	if c := configOf(got); c.Owner != "roched:a.b/t" || c.Image != cfg.Image {
		t.Errorf("the config the claimed Pod carries: owner %q, image %q", c.Owner, c.Image)
	}
	if got.Labels[LabelManaged] != "true" || got.Labels[LabelUID] != "1900000005" {
		t.Errorf("the claim lost other labels: %v", got.Labels)
	}
	c, ok, err := p.Claimed(ctx, pp.id)
	if err != nil || !ok || c.Owner != held.Owner || c.Expires.Unix() != expires.Unix() || c.Env["K"] != "v" || c.Workdir != "/tmp/w" {
		t.Errorf("the claim read back: %+v %v %v, want %+v", c, ok, err, held)
	}
}

// The container's pids cgroup is covered where the node's layout puts it: an empty
// read-only directory over the v1 controller, or a read-only file reading the limit over
// the v2 pids.max (the mounts themselves are tried on the test cluster's v1 node by
// TestConformance/PidsLimitExact).
func TestPodForPidsCgroupMask(t *testing.T) {
	cfg := roche.DefaultConfig()
	cfg.Image = "roche/python:local"
	cfg.PidsLimit = 20
	for _, v2 := range []bool{false, true} {
		pp := testParams()
		pp.cgroupV2 = v2
		pod, err := podFor(kit.Spec{Config: cfg}, pp)
		if err != nil {
			t.Fatal(err)
		}
		var vol *corev1.Volume
		for i := range pod.Spec.Volumes {
			if pod.Spec.Volumes[i].Name == volumePids {
				vol = &pod.Spec.Volumes[i]
			}
		}
		var mnt *corev1.VolumeMount
		for i, m := range pod.Spec.Containers[0].VolumeMounts {
			if m.Name == volumePids {
				mnt = &pod.Spec.Containers[0].VolumeMounts[i]
			}
		}
		if vol == nil || mnt == nil || !mnt.ReadOnly {
			t.Fatalf("v2 %v: pids volume %+v mounted %+v, want both, read-only", v2, vol, mnt)
		}
		if pod.Annotations[AnnotationPidsMax] != "20" {
			t.Errorf("annotation %s = %q, want 20", AnnotationPidsMax, pod.Annotations[AnnotationPidsMax])
		}
		switch {
		case !v2 && (vol.EmptyDir == nil || mnt.MountPath != "/sys/fs/cgroup/pids" || mnt.SubPath != ""):
			t.Errorf("cgroup v1: %+v at %+v, want an empty directory at /sys/fs/cgroup/pids", vol.VolumeSource, mnt)
		case v2 && (vol.DownwardAPI == nil || len(vol.DownwardAPI.Items) != 1 || vol.DownwardAPI.Items[0].FieldRef == nil ||
			vol.DownwardAPI.Items[0].FieldRef.FieldPath != "metadata.annotations['"+AnnotationPidsMax+"']" ||
			mnt.MountPath != "/sys/fs/cgroup/pids.max" || mnt.SubPath != "pids.max"):
			t.Errorf("cgroup v2: %+v at %+v, want the annotation's file at /sys/fs/cgroup/pids.max", vol.VolumeSource, mnt)
		}
	}
}

// TestAgentImagePullPolicy: an agent image named after the local binary is never pulled
// (no registry has it, and the kubelet would ask a public one); one given with
// --agent-image (a registry's copy) is pulled when missing.
func TestAgentImagePullPolicy(t *testing.T) {
	cfg := roche.DefaultConfig()
	pp := testParams()
	for _, local := range []bool{true, false} {
		pp.agentLocal = local
		pod, err := podFor(kit.Spec{Config: cfg}, pp)
		if err != nil {
			t.Fatal(err)
		}
		want := corev1.PullIfNotPresent
		if local {
			want = corev1.PullNever
		}
		if got := pod.Spec.InitContainers[0].ImagePullPolicy; got != want {
			t.Errorf("agent image (local %v) pull policy %s, want %s", local, got, want)
		}
	}
}

// TestPodForGVisor: on a gVisor RuntimeClass the agent forks commands as the sandbox user
// and keeps CAP_SYS_RESOURCE of gVisor's kernel (gvisor.go); on any other, neither.
func TestPodForGVisor(t *testing.T) {
	for _, tc := range []struct {
		class  string
		gvisor bool
	}{{"gvisor", true}, {"my-runsc", true}, {"kata", false}, {"", false}} {
		if got := gvisorClass(tc.class); got != tc.gvisor {
			t.Errorf("gvisorClass(%q) = %v, want %v", tc.class, got, tc.gvisor)
		}
		pp := testParams()
		pp.runtimeClass, pp.gvisor = tc.class, gvisorClass(tc.class)
		pod, err := podFor(kit.Spec{Config: roche.DefaultConfig()}, pp)
		if err != nil {
			t.Fatal(err)
		}
		c := pod.Spec.Containers[0]
		fork := slices.Contains(c.Command, "--fork-as-user")
		resource := slices.Contains(c.SecurityContext.Capabilities.Add, "SYS_RESOURCE")
		if fork != tc.gvisor || resource != tc.gvisor {
			t.Errorf("class %q: --fork-as-user %v, CAP_SYS_RESOURCE %v, want both %v", tc.class, fork, resource, tc.gvisor)
		}
		if len(c.SecurityContext.Capabilities.Add) != len(agentCaps)+map[bool]int{true: 1}[tc.gvisor] {
			t.Errorf("class %q: capabilities %v", tc.class, c.SecurityContext.Capabilities.Add)
		}
		// gVisor's mount hints make /tmp and /dev/shm tmpfs of its kernel, of their size
		// (64 MiB under the default config); no other Pod has any.
		hints := map[string]string{}
		for k, v := range pod.Annotations {
			if strings.HasPrefix(k, "dev.gvisor.") {
				hints[k] = v
			}
		}
		want := map[string]string{}
		if tc.gvisor {
			for _, v := range []string{"tmp", "shm"} {
				want["dev.gvisor.spec.mount."+v+".type"] = "tmpfs"
				want["dev.gvisor.spec.mount."+v+".share"] = "container"
				want["dev.gvisor.spec.mount."+v+".options"] = "rw,size=67108864"
			}
		}
		if !maps.Equal(hints, want) {
			t.Errorf("class %q: gVisor annotations %v, want %v", tc.class, hints, want)
		}
	}
}

// TestClientRate: the API client's rate limit is the default unless WithClientRate sets
// it, and a burst below a larger rate is raised to it.
func TestClientRate(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		qps       float32
		burst     int
		wantQPS   float32
		wantBurst int
	}{{0, 0, DefaultClientQPS, DefaultClientBurst}, {400, 800, 400, 800}, {400, 0, 400, 400}, {5, 0, 5, DefaultClientBurst}} {
		p, err := New(WithKubeconfig(kubeconfig), WithAgentImage("roche/agent:x"), WithClientRate(tc.qps, tc.burst))
		if err != nil {
			t.Fatal(err)
		}
		if p.rest == nil || p.rest.QPS != tc.wantQPS || p.rest.Burst != tc.wantBurst {
			t.Errorf("WithClientRate(%g, %d): client %+v, want %g/s burst %d", tc.qps, tc.burst, p.rest, tc.wantQPS, tc.wantBurst)
		}
		p.Close()
	}
}
