package kit

import (
	"context"
	"errors"
	"strings"

	"github.com/roche-sandbox/roche"
)

// Finding is one thing a provider needs of its host, checked: what roche doctor and
// roched's GET /healthz?verbose report, piece by piece.
type Finding struct {
	// Check names what was checked, short and stable: "engine", "runtime", "image",
	// "agent", "python.wasm", "kvm", "cluster", ...
	Check string `json:"check"`
	// OK says it is there and works.
	OK bool `json:"ok"`
	// Detail says what was found: a version, a path, or, when not OK, what is wrong.
	Detail string `json:"detail"`
	// Fix, when not OK, is the command that makes it so, run on the provider's host;
	// AsRoot says it needs root there.
	Fix    string `json:"fix,omitempty"`
	AsRoot bool   `json:"as_root,omitempty"`
	// Optional: only some sandboxes need it (sized disks, for --writable roots and
	// workspaces); the provider runs the default sandbox without it.
	Optional bool `json:"optional,omitempty"`
}

// Diagnoser is a provider that checks, one piece at a time, what it needs of its host,
// reusing the checks its Create makes: the engine answering, the image present, the
// runtime registered, the hypervisor, the agent binary. roche doctor asks each provider.
type Diagnoser interface {
	// Diagnose checks what the provider needs to run image (DiagnoseImage when
	// empty), in the order its Create needs them, each bounded by ctx. It never
	// creates a sandbox, and leaves nothing behind.
	Diagnose(ctx context.Context, image string) []Finding
}

// Found is check's finding for err: OK with detail when err is nil, else err's text,
// with the command of a roche.Remedy in its chain as the fix.
func Found(check string, err error, detail string) Finding {
	if err == nil {
		return Finding{Check: check, OK: true, Detail: detail}
	}
	f := Finding{Check: check, Detail: err.Error()}
	var r *roche.Remedy
	if errors.As(err, &r) {
		f.Detail, f.Fix, f.AsRoot = r.Err.Error(), r.Run, r.AsRoot
	}
	// "provider unavailable: " says nothing a finding that does not hold does not.
	f.Detail = strings.TrimPrefix(f.Detail, roche.ErrUnavailable.Error()+": ")
	return f
}

// Lacks is check's finding for err: what is missing, and run, the command that fixes
// it, unless err carries a roche.Remedy of its own.
func Lacks(check string, err error, run string, asRoot bool) Finding {
	f := Found(check, err, "")
	if !f.OK && f.Fix == "" && run != "" {
		f.Fix, f.AsRoot = run, asRoot
	}
	return f
}

// DiagnoseImage is the image a diagnosis looks for when none is named: the one roche
// image build python makes.
const DiagnoseImage = "roche/python:local"
