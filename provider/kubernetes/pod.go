package kubernetes

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/egress"
	"github.com/roche-sandbox/roche/internal/guest/podlink"
	"github.com/roche-sandbox/roche/provider/internal/agentspec"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Labels on every Pod (and NetworkPolicy) Roche creates, so that list, gc and
// reconciliation find them by label and never touch anything else. Values that a label
// cannot hold (the owner, the config) are annotations.
const (
	LabelManaged  = "roche.managed"
	LabelProvider = "roche.provider"
	// LabelSandbox, on a NetworkPolicy, names the Pod it is for (and selects it).
	LabelSandbox = "roche.sandbox"
	// LabelExpires is the end of the sandbox's lifetime, in Unix seconds.
	LabelExpires = "roche.expires"
	// LabelUID is the uid the sandbox's commands run as ("" for a name only the image knows).
	LabelUID = "roche.uid"
	// LabelNetwork is NetworkNone on a Pod whose network is off: a CNI that honours it
	// (the test cluster's) then gives the Pod only loopback; the deny-all NetworkPolicy
	// is what any policy-enforcing CNI honours.
	LabelNetwork = "roche.network"
	NetworkNone  = "none"
	NetworkOn    = "on"
	// AnnotationOwner is the sandbox's owner; AnnotationConfig its whole kit.Spec (the
	// Config with the owner and lease) as JSON.
	AnnotationOwner  = "roche.owner"
	AnnotationConfig = "roche.config"
	// AnnotationPidsMax is the sandbox's process limit, which a cgroup v2 node's Pod
	// reads as its pids.max (pidsCgroupMask).
	AnnotationPidsMax = "roche.pids-max"
	// AnnotationClaim, on a pooled sandbox claimed for a holder (Claim), is the env and
	// workdir the holder's create asked for, as JSON.
	AnnotationClaim = "roche.claim"
)

// Container and volume names in a sandbox's Pod.
const (
	containerSandbox = "sandbox"
	containerInstall = "roche-agent-install"
	volumeAgent      = "roche-agent"
	volumeTmp        = "tmp"
	volumeShm        = "shm"
	volumePids       = "pids-cgroup"
)

// agentCaps are the capabilities the agent keeps, as under Docker (agentspec.Caps).
var agentCaps = func() []corev1.Capability {
	caps := make([]corev1.Capability, len(agentspec.Caps))
	for i, c := range agentspec.Caps {
		caps[i] = corev1.Capability(c)
	}
	return caps
}()

// Requests are what the scheduler reserves for a sandbox: little, since a sandbox idles
// between commands; the limits are the Config's.
var (
	requestCPU    = resource.MustParse("50m")
	requestMemory = resource.MustParse("32Mi")
)

// podParams is what a Pod is made from besides the Config.
type podParams struct {
	id, namespace string
	agentImage    string
	agentLocal    bool // agentImage is only ever imported: never pulled
	runtimeClass  string
	// user is "uid:gid" or the caller's user; uid is its number, -1 for a name.
	user string
	uid  int
	// expires is the end of the sandbox's lifetime.
	expires time.Time
	// seccomp is the containers' seccomp profile: a Localhost profile on the nodes
	// (relative to the kubelet's seccomp directory), or SeccompRuntimeDefault.
	seccomp string
	// lease, for a leased sandbox, is its create's deadline (agentspec.Spec.Lease).
	lease time.Duration
	// leaseGrace, when positive, replaces agentspec.LeaseGrace (WithLeaseGrace).
	leaseGrace time.Duration
	// cgroupV2 says the nodes have the unified cgroup hierarchy (see pidsCgroupMask).
	cgroupV2 bool
	// trustEnv is what the sandbox's egress proxy puts in its environment: the CA
	// variables, and each secret's placeholder (egress.TrustPEM).
	trustEnv []string
	// gvisor says the RuntimeClass is gVisor's (gvisor.go).
	gvisor bool
	// claim is the PersistentVolumeClaim of the sandbox's workspace, "" for none
	// (workspace.go).
	claim string
}

func ptr[T any](v T) *T { return &v }

// podFor maps cfg onto a Pod with Roche's secure defaults. cfg is valid and supported.
func podFor(cfg kit.Spec, pp podParams) (*corev1.Pod, error) {
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	labels := map[string]string{
		LabelManaged:  "true",
		LabelProvider: Name,
		LabelExpires:  strconv.FormatInt(pp.expires.Unix(), 10),
		LabelNetwork:  NetworkNone,
		LabelSandbox:  pp.id,
	}
	if cfg.Network {
		labels[LabelNetwork] = NetworkOn
	}
	if pp.uid >= 0 {
		labels[LabelUID] = strconv.Itoa(pp.uid)
	}
	env := []corev1.EnvVar{}
	for _, k := range slices.Sorted(maps.Keys(cfg.Env)) {
		env = append(env, corev1.EnvVar{Name: k, Value: cfg.Env[k]})
	}
	// HOME is somewhere the sandbox user can write (the image's passwd knows no drawn uid).
	if _, set := cfg.Env["HOME"]; !set {
		env = append(env, corev1.EnvVar{Name: "HOME", Value: "/tmp"})
	}
	limits := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(int64(cfg.CPUs*1000+0.5), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(cfg.MemoryBytes(), resource.BinarySI),
	}
	requests := corev1.ResourceList{
		corev1.ResourceCPU:    minQuantity(requestCPU, limits[corev1.ResourceCPU]),
		corev1.ResourceMemory: minQuantity(requestMemory, limits[corev1.ResourceMemory]),
	}
	seccomp := seccompFor(pp.seccomp)
	tmpSize := resource.NewQuantity(cfg.TmpSize(), resource.BinarySI)
	agent := agentspec.Spec{
		Socket: podlink.Socket, Owner: 0, User: pp.user,
		Lifetime: time.Duration(cfg.TimeoutSecs) * time.Second,
		// The node's podPidsLimit is the Pod's whole bound; this one is the sandbox
		// user's own (its uid is the sandbox's own unless the caller named one).
		NProc: cfg.PidsLimit,
		Lease: pp.lease, Grace: pp.leaseGrace,
	}
	if pp.claim != "" {
		// A new volume's root is root's: the agent hands it to the sandbox user.
		agent.Own = roche.WorkspacePath
	}
	if len(cfg.NetworkAllowlist) > 0 {
		// Programs reach the agent's proxy port; the agent relays each connection to
		// the egress socket, which the host's relay session serves (podlink.Mux).
		agent.EgressSocket = podlink.EgressSocket
		for _, kv := range append(egress.SandboxEnv(), pp.trustEnv...) {
			k, v, _ := strings.Cut(kv, "=")
			env = append(env, corev1.EnvVar{Name: k, Value: v})
		}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: pp.id, Namespace: pp.namespace, Labels: labels,
			Annotations: map[string]string{AnnotationOwner: cfg.Owner, AnnotationConfig: string(cfgJSON),
				AnnotationPidsMax: strconv.Itoa(cfg.PidsLimit)},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			ActiveDeadlineSeconds:         ptr(int64(cfg.TimeoutSecs)),
			TerminationGracePeriodSeconds: ptr(int64(2)),
			AutomountServiceAccountToken:  ptr(false),
			EnableServiceLinks:            ptr(false),
			HostNetwork:                   false,
			HostPID:                       false,
			HostIPC:                       false,
			ShareProcessNamespace:         ptr(false),
			// The Pod's own sandbox (its pause container) runs nothing of the sandbox's and
			// keeps the runtime's default; the containers have Roche's profile. Set on the
			// containers, a profile missing from the node fails the container's creation with
			// a reason in the Pod's status (which the create reports), where on the Pod it
			// would fail the Pod's sandbox and leave the Pod Pending.
			SecurityContext: &corev1.PodSecurityContext{
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			InitContainers: []corev1.Container{{
				Name:            containerInstall,
				Image:           pp.agentImage,
				ImagePullPolicy: agentPullPolicy(pp.agentLocal),
				Command:         []string{podlink.ImageAgent, podlink.InstallArg, "/agent"},
				Resources:       corev1.ResourceRequirements{Limits: limits, Requests: requests},
				SecurityContext: &corev1.SecurityContext{
					RunAsUser: ptr(int64(0)), RunAsGroup: ptr(int64(0)), RunAsNonRoot: ptr(false),
					ReadOnlyRootFilesystem:   ptr(true),
					AllowPrivilegeEscalation: ptr(false),
					Privileged:               ptr(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					SeccompProfile:           seccomp,
				},
				VolumeMounts:             []corev1.VolumeMount{{Name: volumeAgent, MountPath: "/agent"}},
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
			Containers: []corev1.Container{{
				Name:            containerSandbox,
				Image:           cfg.Image,
				ImagePullPolicy: corev1.PullIfNotPresent,
				Command:         append([]string{podlink.Agent}, agent.Args()...),
				Env:             env,
				WorkingDir:      cfg.Workdir,
				Resources:       corev1.ResourceRequirements{Limits: limits, Requests: requests},
				SecurityContext: &corev1.SecurityContext{
					// The agent, PID 1, runs as root with agentCaps, drops its bounding set
					// and runs every command as pp.user without capabilities.
					RunAsUser: ptr(int64(0)), RunAsGroup: ptr(int64(0)), RunAsNonRoot: ptr(false),
					ReadOnlyRootFilesystem:   ptr(!cfg.Writable),
					AllowPrivilegeEscalation: ptr(false),
					Privileged:               ptr(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: agentCaps},
					SeccompProfile:           seccomp,
				},
				VolumeMounts: []corev1.VolumeMount{
					{Name: volumeAgent, MountPath: podlink.Dir},
					{Name: volumeTmp, MountPath: "/tmp"},
					{Name: volumeShm, MountPath: "/dev/shm"},
				},
				// The kubelet makes the termination message file world-writable on the
				// node's disk, with no bound: out of the sandbox user's reach (podlink).
				TerminationMessagePath:   podlink.TerminationLog,
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
			Volumes: []corev1.Volume{
				// The agent binary and its socket directory: a few MiB on the node's disk.
				{Name: volumeAgent, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
					SizeLimit: resource.NewQuantity(64<<20, resource.BinarySI),
				}}},
				// /tmp and /dev/shm are tmpfs of Config.TmpSize, as under Docker: what is
				// written there counts against the memory limit, and past the size a
				// write fails with ENOSPC.
				{Name: volumeTmp, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
					Medium: corev1.StorageMediumMemory, SizeLimit: tmpSize,
				}}},
				{Name: volumeShm, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
					Medium: corev1.StorageMediumMemory, SizeLimit: tmpSize,
				}}},
			},
		},
	}
	pidsCgroupMask(pod, pp.cgroupV2)
	if pp.claim != "" {
		workspaceVolume(pod, pp.claim)
	}
	if pp.gvisor {
		// gVisor charges a task to the user that creates it, and holds root to
		// RLIMIT_NPROC unless it has CAP_SYS_RESOURCE (gvisor.go).
		agent.ForkAsUser = true
		// And refuses to start where the runtime did not honour the mount hints below.
		agent.ScratchMax = cfg.TmpSize()
		c := &pod.Spec.Containers[0]
		c.Command = append([]string{podlink.Agent}, agent.Args()...)
		c.SecurityContext.Capabilities.Add = append(slices.Clone(agentCaps), "SYS_RESOURCE")
		// /tmp and /dev/shm as tmpfs of gVisor's kernel, of their size (gvisor.go).
		gvisorMountHints(pod, cfg.TmpSize())
	}
	if pp.runtimeClass != "" {
		pod.Spec.RuntimeClassName = ptr(pp.runtimeClass)
	}
	return pod, nil
}

// pidsCgroupMask keeps the sandbox's pids cgroup from reading as a limit other than the
// one that holds. The agent holds the sandbox user to exactly Config.PidsLimit
// (RLIMIT_NPROC, --nproc); the node bounds the whole Pod (its podPidsLimit, at the Pod's
// cgroup), and the container's own pids cgroup, which is what a program finds under
// /sys/fs/cgroup, reads "max", as if nothing bounded it. As the docker and oci providers
// mask it, so does this one: on a cgroup v1 node, an empty read-only directory over the
// container's pids controller (/sys/fs/cgroup/pids); on a v2 node, whose pids.max is a
// file of the container's own cgroup directory, a read-only file over it that reads the
// limit (from the Pod's AnnotationPidsMax, through the downward API). Kubernetes has no
// masked paths of its own, and a mount's target must exist in the node's layout, which
// is why the layout must be known (WithNodeCgroup).
func pidsCgroupMask(pod *corev1.Pod, v2 bool) {
	c := &pod.Spec.Containers[0]
	if !v2 {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: volumePids, VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: resource.NewQuantity(4096, resource.BinarySI)},
		}})
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: volumePids, MountPath: "/sys/fs/cgroup/pids", ReadOnly: true})
		return
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: volumePids, VolumeSource: corev1.VolumeSource{
		DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{{
			Path:     "pids.max",
			FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['" + AnnotationPidsMax + "']"},
			Mode:     ptr(int32(0o444)),
		}}},
	}})
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: volumePids, MountPath: "/sys/fs/cgroup/pids.max", SubPath: "pids.max", ReadOnly: true})
}

// seccompFor is the containers' seccomp profile: the runtime's default when asked in so
// many words, else the Localhost profile named.
func seccompFor(name string) *corev1.SeccompProfile {
	if name == SeccompRuntimeDefault {
		return &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	}
	return &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: ptr(name)}
}

// minQuantity is the smaller of a and b.
func minQuantity(a, b resource.Quantity) resource.Quantity {
	if b.Cmp(a) < 0 {
		return b
	}
	return a
}

// networkPolicyFor is the deny-all policy of a sandbox whose network is off: it selects
// the sandbox's Pod alone and allows no traffic in or out. It is made before the Pod, so
// there is no moment at which the Pod runs without it.
func networkPolicyFor(id, namespace string) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{
			Name: id, Namespace: namespace,
			Labels: map[string]string{LabelManaged: "true", LabelProvider: Name, LabelSandbox: id},
		},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{
				LabelManaged: "true", LabelProvider: Name, LabelSandbox: id,
			}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			// No rules: nothing in, nothing out.
		},
	}
}

// expiresOf reads LabelExpires.
func expiresOf(labels map[string]string) time.Time {
	sec, err := strconv.ParseInt(labels[LabelExpires], 10, 64)
	if err != nil {
		return time.Time{}
	}
	return time.Unix(sec, 0)
}

// configOf reads AnnotationConfig.
func configOf(pod *corev1.Pod) kit.Spec {
	var cfg kit.Spec
	_ = json.Unmarshal([]byte(pod.Annotations[AnnotationConfig]), &cfg)
	return cfg
}

// isOurs reports whether pod is a sandbox this provider made.
func isOurs(pod *corev1.Pod) bool {
	return pod.Labels[LabelManaged] == "true" && pod.Labels[LabelProvider] == Name
}

// stateOf maps a Pod's phase onto a sandbox state.
func stateOf(pod *corev1.Pod) roche.SandboxState {
	if pod.DeletionTimestamp != nil {
		return roche.StateExited
	}
	switch pod.Status.Phase {
	case corev1.PodRunning:
		return roche.StateRunning
	case corev1.PodPending, "":
		return roche.StateCreated
	}
	return roche.StateExited
}

// describeWaiting explains why a Pod is not running yet, or "" when nothing is wrong yet.
// agentPullPolicy keeps the kubelet from asking a registry (a public one, by default)
// for an agent image named after the local binary, which only an import puts on a node.
func agentPullPolicy(local bool) corev1.PullPolicy {
	if local {
		return corev1.PullNever
	}
	return corev1.PullIfNotPresent
}

func describeWaiting(pod *corev1.Pod) (reason, message string) {
	for _, st := range append(slices.Clone(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...) {
		if w := st.State.Waiting; w != nil && w.Reason != "" && w.Reason != "PodInitializing" && w.Reason != "ContainerCreating" {
			return w.Reason, fmt.Sprintf("container %s (image %s): %s: %s", st.Name, st.Image, w.Reason, w.Message)
		}
		if term := st.State.Terminated; term != nil && term.ExitCode != 0 {
			return "Terminated", fmt.Sprintf("container %s exited %d (%s): %s", st.Name, term.ExitCode, term.Reason, firstLine(term.Message))
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return c.Reason, "the Pod cannot be scheduled: " + c.Message
		}
	}
	return "", ""
}
