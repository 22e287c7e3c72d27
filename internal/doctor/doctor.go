// Package doctor is roche doctor and roched's GET /healthz?verbose: for every provider,
// whether it can run here and, when not, the one missing piece and the command that
// fixes it; and the host's facts the providers depend on (cgroups, user namespaces, the
// agent binary) and roched. The checks are the providers' own (kit.Diagnoser), reached
// through the constructors it is given, so that it links no backend: the thin roche
// reads its report too. Every provider is checked at once, each bounded, so that an
// engine that hangs costs the report its bound and no more.
package doctor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/buildinfo"
	"github.com/roche-sandbox/roche/internal/catalog"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Schema is the version of Report's JSON; it changes only when a field changes meaning
// or goes away (docs/doctor.md).
const Schema = 1

// DefaultTimeout bounds each provider's diagnosis.
const DefaultTimeout = 4 * time.Second

// Report is what roche doctor prints (--json: this, as JSON) and /healthz?verbose
// returns.
type Report struct {
	Schema  int    `json:"schema"`
	Version string `json:"version"` // of the roche (or roched) that made the report
	// Default is the provider a create that names none uses, and DefaultOK whether it
	// can run here: roche doctor's exit status.
	Default   string     `json:"default"`
	DefaultOK bool       `json:"default_ok"`
	Providers []Provider `json:"providers"`
	// Host is what the providers depend on of the host, and Roched whether roched
	// answers (absent from roched's own report).
	Host   []kit.Finding `json:"host"`
	Roched *kit.Finding  `json:"roched,omitempty"`
}

// Provider is one provider (with one runtime, for those that have several) on this host.
type Provider struct {
	Name string `json:"name"`
	// Runtime is the runtime checked: runc or runsc for docker, crun or runc for oci;
	// empty for the others.
	Runtime string `json:"runtime,omitempty"`
	// OK: every check that is not Optional holds, so its default sandbox can run.
	OK bool `json:"ok"`
	// Missing is the first check that does not hold (its Check), Detail what is wrong,
	// Fix the command that fixes it (AsRoot: as root), empty when no command does.
	Missing string `json:"missing,omitempty"`
	Detail  string `json:"detail,omitempty"`
	Fix     string `json:"fix,omitempty"`
	AsRoot  bool   `json:"as_root,omitempty"`
	// Checks is every check made, in order.
	Checks []kit.Finding `json:"checks"`
}

// Options is how to reach the providers, and what to check.
type Options struct {
	// Open opens a provider with settings (inproc.Open); what it opens is closed once
	// diagnosed. It returns an error for a provider this binary cannot open.
	Open func(name string, o catalog.Options) (roche.Provider, error)
	// Settings are the providers' settings (--kubeconfig, ...); Runtime and OCIRuntime
	// are set per target.
	Settings catalog.Options
	// Image is the image to look for (kit.DiagnoseImage when empty); Default the default
	// provider (catalog.Default when empty).
	Image, Default string
	// Timeout bounds each provider's diagnosis (DefaultTimeout when zero).
	Timeout time.Duration
	// Roched, when set, checks roched (roche doctor; roched's own report has none).
	Roched func(ctx context.Context) kit.Finding
}

// target is one entry of the report: a provider with one runtime.
type target struct {
	name, runtime string
	// get returns the provider and what releases it.
	get func() (roche.Provider, func(), error)
}

// runtimes are the runtimes roche doctor checks of the providers that have several: the
// engine's runc and gVisor for docker, both OCI runtimes for oci.
var runtimes = map[string][]string{"docker": {"runc", "runsc"}, "oci": {"crun", "runc"}}

// Run checks every provider, each runtime of those that have several, with o.Open.
func Run(ctx context.Context, o Options) Report {
	var targets []target
	for _, name := range catalog.Names() {
		rts := runtimes[name]
		if len(rts) == 0 {
			rts = []string{""}
		}
		for _, rt := range rts {
			s := o.Settings
			switch name {
			case "docker":
				s.Runtime = rt
			case "oci":
				s.OCIRuntime = rt
			}
			targets = append(targets, target{name: name, runtime: rt, get: func() (roche.Provider, func(), error) {
				p, err := o.Open(name, s)
				if err != nil {
					return nil, nil, err
				}
				return p, func() {
					if c, ok := p.(io.Closer); ok {
						_ = c.Close()
					}
				}, nil
			}})
		}
	}
	return run(ctx, o, targets)
}

// Served checks the providers a process serves (roched), as they were opened, runtime
// included, and reports why each provider it left out was left out. It closes none.
func Served(ctx context.Context, o Options, served map[string]roche.Provider, leftOut map[string]error) Report {
	var targets []target
	for _, name := range catalog.Names() {
		if p, ok := served[name]; ok {
			rt := ""
			if r, ok := p.(interface{ Runtime() string }); ok { // docker's engine runtime
				rt = r.Runtime()
			}
			targets = append(targets, target{name: name, runtime: rt, get: func() (roche.Provider, func(), error) { return p, func() {}, nil }})
		} else if err, ok := leftOut[name]; ok {
			targets = append(targets, target{name: name, get: func() (roche.Provider, func(), error) { return nil, nil, fmt.Errorf("not served: %w", err) }})
		}
	}
	return run(ctx, o, targets)
}

func run(ctx context.Context, o Options, targets []target) Report {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Default == "" {
		o.Default = catalog.Default
	}
	r := Report{Schema: Schema, Version: buildinfo.Version(), Default: o.Default, Providers: make([]Provider, len(targets))}
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.Providers[i] = diagnose(ctx, o, t)
		}()
	}
	var roched kit.Finding
	if o.Roched != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx, cancel := context.WithTimeout(ctx, o.Timeout)
			defer cancel()
			roched = o.Roched(rctx)
		}()
	}
	r.Host = Host()
	wg.Wait()
	if o.Roched != nil {
		r.Roched = &roched
	}
	r.DefaultOK = defaultOK(r.Providers, o.Default, o.Settings)
	return r
}

// defaultOK reports whether the default provider can run its default sandbox: docker
// on its runtime (runc unless --runtime says otherwise), oci on any runtime (it takes
// the first that works), the others as checked.
func defaultOK(ps []Provider, name string, s catalog.Options) bool {
	want := ""
	switch name {
	case "docker":
		want = cmpOr(s.Runtime, "runc")
	case "oci":
		want = s.OCIRuntime
	}
	for _, p := range ps {
		if p.Name == name && p.OK && (want == "" || p.Runtime == "" || p.Runtime == want) {
			return true
		}
	}
	return false
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// diagnose checks one target within o.Timeout. A diagnosis that has not returned by
// then (a check that ignores its context) is reported as not answering, and goes on in
// the background until it returns, releasing its provider then.
func diagnose(ctx context.Context, o Options, t target) Provider {
	out := Provider{Name: t.name, Runtime: t.runtime}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	done := make(chan []kit.Finding, 1)
	go func() {
		p, release, err := t.get()
		if err != nil {
			done <- []kit.Finding{openFinding(err)}
			return
		}
		defer release()
		d, ok := p.(kit.Diagnoser)
		if !ok {
			done <- []kit.Finding{kit.Found("provider", fmt.Errorf("%w: the %s provider in this binary checks nothing of its host", roche.ErrUnsupported, t.name), "")}
			return
		}
		done <- d.Diagnose(ctx, o.Image)
	}()
	select {
	case out.Checks = <-done:
	case <-ctx.Done():
		// A grace for a check that returns on its context's end with its own, better error.
		select {
		case out.Checks = <-done:
		case <-time.After(250 * time.Millisecond):
			out.Checks = []kit.Finding{kit.Found("answer", fmt.Errorf("%w: the %s provider's checks did not finish within %s (an engine that hangs?)", roche.ErrTimeout, t.name, o.Timeout), "")}
		}
	}
	out.OK = true
	for _, f := range out.Checks {
		if !f.OK && !f.Optional {
			out.OK, out.Missing, out.Detail, out.Fix, out.AsRoot = false, f.Check, f.Detail, f.Fix, f.AsRoot
			break
		}
	}
	return out
}

// openFinding is the finding for a provider that could not be opened: not set up at all
// (the kubernetes provider without a cluster), or refused by its constructor.
func openFinding(err error) kit.Finding {
	var nc *catalog.NotConfiguredError
	if errors.As(err, &nc) && nc.Fix != "" {
		return kit.Lacks(nc.Check, err, nc.Fix, false)
	}
	return kit.Found("provider", err, "")
}

// Text writes r for a person: one line per provider, then what is missing and its fix,
// then the host's facts and roched.
func (r Report) Text(w io.Writer) {
	for _, p := range r.Providers {
		name := p.Name
		if p.Runtime != "" {
			name += " (" + p.Runtime + ")"
		}
		if name == r.Default || (p.Name == r.Default && p.Runtime == "runc") {
			name += ", the default"
		}
		if p.OK {
			var parts []string
			for _, f := range p.Checks {
				if f.OK {
					parts = append(parts, f.Check+": "+f.Detail)
				}
			}
			fmt.Fprintf(w, "ok       %s: %s\n", name, strings.Join(parts, "; "))
			for _, f := range p.Checks {
				if !f.OK {
					fmt.Fprintf(w, "         %s (optional): %s\n", f.Check, f.Detail)
					if f.Fix != "" {
						fmt.Fprintf(w, "         fix: %s\n", fixLine(f.Fix, f.AsRoot))
					}
				}
			}
			continue
		}
		fmt.Fprintf(w, "MISSING  %s: %s: %s\n", name, p.Missing, p.Detail)
		if p.Fix != "" {
			fmt.Fprintf(w, "         fix: %s\n", fixLine(p.Fix, p.AsRoot))
		}
	}
	fmt.Fprintln(w)
	facts := slices.Clone(r.Host)
	if r.Roched != nil {
		facts = append(facts, *r.Roched)
	}
	for _, f := range facts {
		state := "ok      "
		if !f.OK {
			state = "MISSING "
		}
		fmt.Fprintf(w, "%s %s: %s\n", state, f.Check, f.Detail)
		if !f.OK && f.Fix != "" {
			fmt.Fprintf(w, "         fix: %s\n", fixLine(f.Fix, f.AsRoot))
		}
	}
	if r.DefaultOK {
		fmt.Fprintf(w, "\nthe default provider, %s, can run sandboxes here\n", r.Default)
	} else {
		fmt.Fprintf(w, "\nthe default provider, %s, cannot run sandboxes here: see above (ROCHE_PROVIDER picks another)\n", r.Default)
	}
}

func fixLine(run string, asRoot bool) string {
	if asRoot {
		return run + " (as root)"
	}
	return run
}
