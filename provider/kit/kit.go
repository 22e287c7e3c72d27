// Package kit is for provider authors: what a backend implements beyond roche.Provider
// and the helpers that make it behave like the others. A program that uses Roche needs
// none of it, the root package roche being its API, unless it creates sandboxes on
// someone's behalf or tied to itself with a lease (Create).
//
// It holds:
//   - Create and CreateOptions: how a program that creates on someone's behalf (roched,
//     the CLI, a warm pool) names the sandbox's owner and ties it to its creator with a
//     lease, which roche.Config does not carry; a provider takes them as a Creator and
//     keeps them with the sandbox's Config as a Spec;
//   - the optional interfaces a daemon or a warm pool discovers by type assertion, which
//     users never call: Leaser, Prober, Watcher and WatchLister, Claimer, CodeWarmer and Templater, Copier for
//     a provider that relays copies, and Diagnoser, what roche doctor asks of each;
//   - the shared bodies of what every provider does the same way: Collect and
//     MarkUnstarted for a garbage collection, Captures, OutputCapture and LogCapture for
//     a command's or a cell's output, NotConfigured and RetryAfter for its errors.
//
// A provider lives in its own package under provider/ (provider/docker, provider/wasm,
// ...), imports roche and this kit, never another provider, and runs the conformance
// suite in provider/providertest.
package kit

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/roche-sandbox/roche"
)

// Leaser is implemented by providers that honour CreateOptions.Leased.
type Leaser interface {
	// Keep ends the lease of sandbox id, which then lives out its lifetime whoever holds
	// it or goes: a pooled sandbox (leased by the pool) handed to a caller that wants it
	// to outlive its creator.
	Keep(ctx context.Context, id string) error
}

// CodeWarmer is a CodeRunner that can start a language's interpreter before any context
// asks for one: the first context started with the sandbox's own env and workdir (the
// default context's first cell, unless that cell brings other env or a workdir) takes
// it, fresh, instead of waiting for an interpreter to start. A warm pool (pool param
// code) does so for each sandbox it makes. The interpreter counts in the sandbox's
// memory from then on; it is not listed as a context until one takes it.
type CodeWarmer interface {
	// WarmCode starts language's interpreter in sandbox id and returns once it is
	// ready; a second call replaces the first's unused interpreter.
	WarmCode(ctx context.Context, id, language string) error
}

// Templater is a provider that makes sandboxes faster by restoring a memory snapshot
// of one it made before (a template) than by making each anew: a warm pool refills
// from one (provider/vm's qemu restores a microVM instead of booting it). Each sandbox
// restored from a template has its own id, lifetime, lease, clock and randomness.
type Templater interface {
	// MakeTemplate makes a sandbox for cfg and opts, starts language's interpreter in
	// it when language is set (as CodeWarmer does), saves its memory as a template and
	// removes the sandbox. A provider or sandbox kind that cannot is refused with
	// roche.ErrUnsupported, and the caller makes its sandboxes anew.
	MakeTemplate(ctx context.Context, cfg roche.Config, opts CreateOptions, language string) (Template, error)
	// CreateFromTemplate restores t as a new sandbox, made for t's config and options.
	CreateFromTemplate(ctx context.Context, t Template) (roche.SandboxInfo, error)
	// DropTemplate removes what t holds (its saved memory). Sandboxes restored from it
	// go on.
	DropTemplate(t Template)
}

// Template names a template a Templater made.
type Template string

// Copier is a roche.TarCopier that has more to do with a copy's options than
// roche.CopyIn and roche.CopyOut do with its streams: roched's client sends them to the
// daemon, which enforces them on its side too. roche.CopyIn and roche.CopyOut defer to
// it.
type Copier interface {
	CopyIn(ctx context.Context, id, src, dst string, opts roche.CopyOptions) (roche.CopyReport, error)
	CopyOut(ctx context.Context, id, src, dst string, opts roche.CopyOptions) (roche.CopyReport, error)
}

// Collect is the shared body of a GC: of the sandboxes listed, it destroys those a GC
// removes (expired or stopped ones; every one with opts.All) and returns them. With
// opts.DryRun it only returns them. A destroy that fails is reported and the rest go on.
func Collect(ctx context.Context, list []roche.SandboxInfo, opts roche.GCOptions, destroy func(context.Context, string) error) ([]roche.SandboxInfo, error) {
	now := time.Now()
	var removed []roche.SandboxInfo
	var errs []error
	for _, sb := range list {
		if opts.Owner != "" && sb.Owner != opts.Owner {
			continue
		}
		if !opts.All && !sb.Expired(now) && sb.State != roche.StateExited {
			continue
		}
		if !opts.DryRun {
			if err := ctx.Err(); err != nil {
				errs = append(errs, err)
				break
			}
			if err := destroy(ctx, sb.ID); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		removed = append(removed, sb)
	}
	return removed, errors.Join(errs...)
}

// MarkUnstarted marks as exited, for Collect, the sandboxes still in StateCreated longer
// than after past their creation: a provider starts a sandbox as soon as it is made, so
// one that never started is what a create cut short left (the engine finished it once
// Create had gone). after is twice what a create may take.
func MarkUnstarted(list []roche.SandboxInfo, after time.Duration) {
	for i, sb := range list {
		if sb.State == roche.StateCreated && time.Since(sb.CreatedAt) > after {
			list[i].State = roche.StateExited
		}
	}
}

// NotConfigured marks err, a provider's roche.ErrUnavailable, as roche.ErrNotConfigured
// (the provider is not set up on this host at all), its text unchanged.
func NotConfigured(err error) error { return &notConfiguredError{err} }

type notConfiguredError struct{ err error }

func (e *notConfiguredError) Error() string        { return e.err.Error() }
func (e *notConfiguredError) Unwrap() error        { return e.err }
func (e *notConfiguredError) Is(target error) bool { return target == roche.ErrNotConfigured }

// RetryAfter wraps err, a refusal that passes (roche.ErrExhausted, typically), with how
// long the caller should wait before asking again; roche.RetryDelay reads it. roched
// sends the wait as a standard google.rpc.RetryInfo detail, and the Go client gives it
// back.
func RetryAfter(err error, d time.Duration) error { return &retryError{err: err, after: d} }

type retryError struct {
	err   error
	after time.Duration
}

func (e *retryError) Error() string { return e.err.Error() }
func (e *retryError) Unwrap() error { return e.err }

// RetryDelay is what roche.RetryDelay asks an error in the chain for.
func (e *retryError) RetryDelay() time.Duration { return e.after }

// DefaultWorkspaceBytes is roche.DefaultWorkspaceSize in bytes: the size a provider
// makes a new workspace with when the config gives none (Config.WorkspaceBytes is 0).
const DefaultWorkspaceBytes = 1 << 30

// UID is the uid of a Config.User given as "uid[:gid]", or -1 for a name only the image
// knows (and for roche.UserAuto, whose uid the provider draws).
func UID(cfg roche.Config) int {
	name, _, _ := strings.Cut(cfg.User, ":")
	uid, err := strconv.Atoi(name)
	if err != nil || uid < 0 {
		return -1
	}
	return uid
}
