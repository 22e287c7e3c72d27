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

// RetryDelay returns how long err suggests waiting before trying again: a refusal that
// passes (ErrExhausted from a full pool, typically) may say so.
func RetryDelay(err error) (time.Duration, bool) {
	var r interface{ RetryDelay() time.Duration }
	if errors.As(err, &r) {
		return r.RetryDelay(), true
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
// fixes what is missing (an image, python.wasm); Error words it for a Go program.
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

// Error words the error and its fix for a Go program calling a provider in its own
// process; roche's command line, API and MCP server word it for their callers.
func (r *Remedy) Error() string {
	msg := r.Err.Error() + ": make it on this host with " + r.Run
	if r.AsRoot {
		msg += " (as root)"
	}
	if r.Image != "" {
		msg += fmt.Sprintf(", then set Config.Image to %q", r.Image)
	}
	return msg
}
func (r *Remedy) Unwrap() error { return r.Err }
