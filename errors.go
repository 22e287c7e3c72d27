package roche

import (
	"errors"
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
