package catalog

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/defaults"
)

// Settings of one provider. Options carries every provider's settings side by side, and
// each constructor reads only its own: a setting given for one provider and a sandbox
// made by another would be silently dropped. For the isolation settings that is a
// downgrade (--runtime runsc asked for gVisor, the oci provider runs runc), so the CLI
// and roched refuse a setting that none of the providers a command or a daemon uses
// takes (CheckSettings), naming the provider it belongs to and what the other takes for
// the same purpose.

// setting is one provider's setting in Options, as its flag names it.
type setting struct {
	flag     string // without the dashes: "runtime"
	provider string // the provider that reads it
	value    func(Options) string
	// instead says what another provider takes for the same purpose, by provider name.
	instead map[string]string
}

const (
	useRuntime      = "for docker use --runtime (runc, or runsc for gVisor)"
	useOCIRuntime   = "for oci use --oci-runtime (crun or runc)"
	useRuntimeClass = "for kubernetes use --runtime-class (a RuntimeClass the cluster defines, e.g. gvisor)"
)

// settings lists every provider setting of Options; TestEverySettingListed holds it to
// the struct.
var settings = []setting{
	{flag: "runtime", provider: "docker", value: func(o Options) string { return o.Runtime },
		instead: map[string]string{"oci": useOCIRuntime, "kubernetes": useRuntimeClass}},
	{flag: "transport", provider: "docker", value: func(o Options) string {
		if o.Transport == defaults.Transport {
			return "" // the default, given or not
		}
		return o.Transport
	}},
	{flag: "oci-runtime", provider: "oci", value: func(o Options) string { return o.OCIRuntime },
		instead: map[string]string{"docker": useRuntime, "kubernetes": useRuntimeClass}},
	{flag: "runtime-class", provider: "kubernetes", value: func(o Options) string { return o.RuntimeClass },
		instead: map[string]string{"docker": useRuntime, "oci": useOCIRuntime}},
	{flag: "seccomp-profile", provider: "kubernetes", value: func(o Options) string { return o.SeccompProfile },
		instead: map[string]string{
			"docker": "docker sandboxes always run Roche's own seccomp profile",
			"oci":    "oci sandboxes always run Roche's own seccomp profile",
		}},
	{flag: "kubeconfig", provider: "kubernetes", value: func(o Options) string { return o.Kubeconfig }},
	{flag: "namespace", provider: "kubernetes", value: func(o Options) string { return o.Namespace }},
	{flag: "agent-image", provider: "kubernetes", value: func(o Options) string { return o.AgentImage }},
	{flag: "kube-storage-class", provider: "kubernetes", value: func(o Options) string { return o.StorageClass }},
	{flag: "kube-qps", provider: "kubernetes", value: func(o Options) string {
		if o.KubeQPS == 0 {
			return ""
		}
		return strconv.FormatFloat(float64(o.KubeQPS), 'g', -1, 32)
	}},
	{flag: "kube-burst", provider: "kubernetes", value: func(o Options) string {
		if o.KubeBurst == 0 {
			return ""
		}
		return strconv.Itoa(o.KubeBurst)
	}},
}

// Flag is a provider's setting given in Options, as its flag names it.
type Flag struct {
	Name     string // without the dashes: "runtime"
	Value    string
	Provider string // the provider that reads it
}

func (f Flag) String() string { return "--" + f.Name + " " + f.Value }

// Given returns the settings o gives, in the list's order; with names, only those of
// the providers named.
func Given(o Options, names ...string) []Flag {
	var out []Flag
	for _, s := range settings {
		if v := s.value(o); v != "" && (len(names) == 0 || slices.Contains(names, s.provider)) {
			out = append(out, Flag{Name: s.flag, Value: v, Provider: s.provider})
		}
	}
	return out
}

// Asked reports whether o gives any setting of provider name: the operator asked for it.
func Asked(o Options, name string) bool { return len(Given(o, name)) > 0 }

// CheckSettings refuses every setting of o that none of the providers names takes,
// one line each, roche.ErrInvalidConfig. what says who uses names, for the message:
// "this command uses" (the CLI), "roched serves only" (roched --providers).
func CheckSettings(o Options, names []string, what string) error {
	var errs []error
	for _, s := range settings {
		v := s.value(o)
		if v == "" || slices.Contains(names, s.provider) {
			continue
		}
		msg := fmt.Sprintf("--%s is the %s provider's, and %s %s", s.flag, s.provider, what, strings.Join(names, ", "))
		var hints []string
		for _, n := range names {
			if h, ok := s.instead[n]; ok {
				hints = append(hints, h)
			}
		}
		if len(hints) > 0 {
			msg += ": " + strings.Join(hints, "; ") + "; or leave --" + s.flag + " out"
		} else {
			msg += ": leave --" + s.flag + " out, or use the " + s.provider + " provider"
		}
		errs = append(errs, fmt.Errorf("%w: %s", roche.ErrInvalidConfig, msg))
	}
	return errors.Join(errs...)
}
