package roche

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinel errors. Providers wrap them with %w and context; callers test them with
// errors.Is; the daemon turns them into RPC codes only at its API edge.
var (
	// ErrNotFound: no sandbox with that id (or it is not one Roche manages).
	ErrNotFound = errors.New("not found")
	// ErrInvalidConfig: the caller asked for something malformed or impossible.
	ErrInvalidConfig = errors.New("invalid config")
	// ErrUnavailable: the backend (Docker engine, python.wasm, a hypervisor) cannot be reached or used.
	ErrUnavailable = errors.New("provider unavailable")
	// ErrTimeout: an operation ran out of time.
	ErrTimeout = errors.New("timed out")
	// ErrUnsupported: the provider cannot honour the request without weakening it.
	ErrUnsupported = errors.New("unsupported")
	// ErrImageNotFound: the image is not present locally and could not be pulled.
	ErrImageNotFound = errors.New("image not found")
	// ErrExhausted: a limit on sandboxes or resources has been reached.
	ErrExhausted = errors.New("resource exhausted")
	// ErrPermission: the sandbox does not allow it (a read-only path, another user's file,
	// a symlink the files API will not follow).
	ErrPermission = errors.New("permission denied")
	// ErrInUse: the thing is in use (a workspace mounted by a live sandbox).
	ErrInUse = errors.New("in use")
)

// RetryAfter wraps err, a refusal that passes (ErrExhausted, typically), with how long
// the caller should wait before asking again. roched sends the wait as a standard
// google.rpc.RetryInfo detail, and the Go client gives it back; RetryDelay reads it.
func RetryAfter(err error, d time.Duration) error { return &retryError{err: err, after: d} }

type retryError struct {
	err   error
	after time.Duration
}

func (e *retryError) Error() string { return e.err.Error() }
func (e *retryError) Unwrap() error { return e.err }

// RetryDelay returns how long err suggests waiting before trying again (RetryAfter).
func RetryDelay(err error) (time.Duration, bool) {
	var r *retryError
	if errors.As(err, &r) {
		return r.after, true
	}
	return 0, false
}

// ErrNotConfigured: the provider is not set up on this host at all (no Docker engine
// started here, no Kubernetes cluster configured), unlike one set up that fails now (an
// engine that hangs or refuses). It is ErrUnavailable too. A list or count across
// providers leaves such a provider out without a word, and says when it skipped one that
// is set up (PartialError).
var ErrNotConfigured error = notConfigured{}

type notConfigured struct{}

func (notConfigured) Error() string        { return "provider not set up here" }
func (notConfigured) Is(target error) bool { return target == ErrUnavailable }

// NotConfigured marks err, a provider's ErrUnavailable, as ErrNotConfigured, its text
// unchanged.
func NotConfigured(err error) error { return &notConfiguredError{err} }

type notConfiguredError struct{ err error }

func (e *notConfiguredError) Error() string        { return e.err.Error() }
func (e *notConfiguredError) Unwrap() error        { return e.err }
func (e *notConfiguredError) Is(target error) bool { return target == ErrNotConfigured }

// PartialError is returned, with what the others answered, by a list or count across
// providers that could not ask some of them: a caller reading the result alone would
// take what those hold for nothing. Providers not set up here (ErrNotConfigured) are not
// skipped but absent, and are not in it.
type PartialError struct {
	Skipped []SkippedProvider
}

// SkippedProvider is a provider a list or count left out, and why.
type SkippedProvider struct {
	Provider string
	Err      error
}

func (e *PartialError) Error() string {
	parts := make([]string, 0, len(e.Skipped))
	for _, s := range e.Skipped {
		parts = append(parts, s.Provider+" ("+s.Err.Error()+")")
	}
	return "incomplete: skipped " + strings.Join(parts, "; ")
}

// Remedy is an error that says what fixes it, so that each edge can word the fix for
// its caller: a person at the command line runs a command and passes a flag, a program
// using an SDK or roched's API sets a field (and the fix runs on roched's host, not the
// caller's), a Go program sets a Config field. Providers return one where a command
// fixes what is missing (an image, python.wasm); Error words it for a Go program, and
// Advise for the others.
type Remedy struct {
	// Err is what is wrong.
	Err error
	// Run is the command that fixes it, run on the host where the provider runs (roched's
	// host, for an API caller); AsRoot says it needs root there.
	Run    string
	AsRoot bool
	// Image, when set, is the image to ask for once Run has made it.
	Image string
}

// Audience is who reads an error.
type Audience int

const (
	// ForGo is a Go program calling a provider in its own process.
	ForGo Audience = iota
	// ForCLI is a person running roche.
	ForCLI
	// ForClient is a program reaching a provider through roched's API or an SDK
	// (which may use the CLI underneath, with --json).
	ForClient
	// ForModel is a model calling roche mcp's tools.
	ForModel
)

func (r *Remedy) Error() string { return r.Advise(ForGo) }
func (r *Remedy) Unwrap() error { return r.Err }

// Advise words the error and its fix for a.
func (r *Remedy) Advise(a Audience) string {
	run := r.Run
	if r.AsRoot {
		run += " (as root)"
	}
	msg := r.Err.Error()
	switch a {
	case ForCLI:
		msg += ": run " + run
		if r.Image != "" {
			msg += ", then pass --image " + r.Image
		}
	case ForClient:
		msg += ": make it on the host that runs the sandboxes (roched's, when you use roched) with " + run
		if r.Image != "" {
			msg += fmt.Sprintf(", then create sandboxes with image %q", r.Image)
		}
	case ForModel:
		msg += ": this server's host lacks it; tell the user, who can make it there with " + run
		if r.Image != "" {
			msg += fmt.Sprintf(", and then call create_sandbox with image %q", r.Image)
		}
	default:
		msg += ": make it on this host with " + run
		if r.Image != "" {
			msg += fmt.Sprintf(", then set Config.Image to %q", r.Image)
		}
	}
	return msg
}

// Advise words err for a: the text of every Remedy in its chain replaced with its
// advice for a.
func Advise(err error, a Audience) string {
	msg := err.Error()
	var r *Remedy
	if errors.As(err, &r) {
		return strings.Replace(msg, r.Error(), r.Advise(a), 1)
	}
	return msg
}
