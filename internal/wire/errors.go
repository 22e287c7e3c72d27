package wire

import (
	"context"
	"errors"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
)

// sentinels maps each core sentinel to its RPC code and the reason its ErrorDetail
// carries, both ways. Order matters on the way out: an error wrapping two sentinels
// takes the first row that matches.
var sentinels = []struct {
	err    error
	code   connect.Code
	reason rochev1.ErrorReason
	// name is the reason as the CLI's JSON errors and the SDKs spell it.
	name string
}{
	{roche.ErrExhausted, connect.CodeResourceExhausted, rochev1.ErrorReason_ERROR_REASON_EXHAUSTED, "exhausted"},
	{roche.ErrInvalidConfig, connect.CodeInvalidArgument, rochev1.ErrorReason_ERROR_REASON_INVALID_CONFIG, "invalid_config"},
	// The request is fine; the host lacks the image until someone builds or pulls it.
	{roche.ErrImageNotFound, connect.CodeFailedPrecondition, rochev1.ErrorReason_ERROR_REASON_IMAGE_NOT_FOUND, "image_not_found"},
	{roche.ErrNotFound, connect.CodeNotFound, rochev1.ErrorReason_ERROR_REASON_NOT_FOUND, "not_found"},
	{roche.ErrInUse, connect.CodeFailedPrecondition, rochev1.ErrorReason_ERROR_REASON_IN_USE, "in_use"},
	{roche.ErrPermission, connect.CodePermissionDenied, rochev1.ErrorReason_ERROR_REASON_PERMISSION, "permission_denied"},
	{roche.ErrUnsupported, connect.CodeUnimplemented, rochev1.ErrorReason_ERROR_REASON_UNSUPPORTED, "unsupported"},
	{roche.ErrUnavailable, connect.CodeUnavailable, rochev1.ErrorReason_ERROR_REASON_UNAVAILABLE, "unavailable"},
	{roche.ErrTimeout, connect.CodeDeadlineExceeded, rochev1.ErrorReason_ERROR_REASON_TIMEOUT, "timeout"},
}

// Reason names the core sentinel err wraps as the CLI's JSON errors and the SDKs spell
// it ("not_found", "invalid_config", ...), "timeout" for a deadline, or "" for none.
func Reason(err error) string {
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	return ""
}

// ToStatus turns a core error into an RPC error with the matching code, keeping the
// core's message, and attaches an ErrorDetail naming the sentinel so that clients can
// recover it exactly. This is the only place core errors meet RPC codes on the way out.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	code, reason := connect.CodeInternal, rochev1.ErrorReason_ERROR_REASON_UNSPECIFIED
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			code, reason = s.code, s.reason
			break
		}
	}
	if reason == rochev1.ErrorReason_ERROR_REASON_UNSPECIFIED {
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			code, reason = connect.CodeDeadlineExceeded, rochev1.ErrorReason_ERROR_REASON_TIMEOUT
		case errors.Is(err, context.Canceled):
			code = connect.CodeCanceled
		}
	}
	e := connect.NewError(code, err)
	if reason != rochev1.ErrorReason_ERROR_REASON_UNSPECIFIED {
		if d, derr := connect.NewErrorDetail(&rochev1.ErrorDetail{Reason: reason}); derr == nil {
			e.AddDetail(d)
		}
	}
	// A refusal that passes says when to ask again, in the detail gRPC clients know.
	if after, ok := roche.RetryDelay(err); ok {
		if d, derr := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(after)}); derr == nil {
			e.AddDetail(d)
		}
	}
	return e
}

// RetryDelay returns the wait an RPC error's RetryInfo detail suggests, if it has one.
func RetryDelay(ce *connect.Error) (time.Duration, bool) {
	for _, d := range ce.Details() {
		v, err := d.Value()
		if ri, ok := v.(*errdetails.RetryInfo); err == nil && ok && ri.RetryDelay != nil {
			return ri.RetryDelay.AsDuration(), true
		}
	}
	return 0, false
}

// FromStatus returns the core sentinel an RPC error stands for: the one its ErrorDetail
// names, else the one its code alone implies (a daemon or proxy that sent no detail),
// else nil. withDetail says whether a detail named it.
func FromStatus(ce *connect.Error) (sentinel error, withDetail bool) {
	for _, d := range ce.Details() {
		v, err := d.Value()
		if ed, ok := v.(*rochev1.ErrorDetail); err == nil && ok {
			for _, s := range sentinels {
				if s.reason == ed.Reason {
					return s.err, true
				}
			}
		}
	}
	var found error
	for _, s := range sentinels {
		if s.code != ce.Code() {
			continue
		}
		if found != nil {
			return nil, false // FAILED_PRECONDITION stands for more than one
		}
		found = s.err
	}
	return found, false
}
