package wire

import (
	"cmp"
	"context"
	"errors"
	"math"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/internal/remedy"
	"github.com/roche-sandbox/roche/provider/kit"
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
	// detailOnly: a client recovers it from the detail alone, never from the code, which
	// stands for a wider sentinel.
	detailOnly bool
	// back, when set, is what a client recovers instead of err: one error that is both
	// sentinels the row stands for.
	back error
}{
	// Before ErrUnavailable, which it also is; to the SDKs it is "unavailable".
	{err: roche.ErrNotConfigured, code: connect.CodeUnavailable, reason: rochev1.ErrorReason_ERROR_REASON_NOT_CONFIGURED, name: "unavailable",
		detailOnly: true, back: kit.NotConfigured(roche.ErrUnavailable)},
	{err: roche.ErrExhausted, code: connect.CodeResourceExhausted, reason: rochev1.ErrorReason_ERROR_REASON_EXHAUSTED, name: "exhausted"},
	{err: roche.ErrInvalidConfig, code: connect.CodeInvalidArgument, reason: rochev1.ErrorReason_ERROR_REASON_INVALID_CONFIG, name: "invalid_config"},
	// The request is fine; the host lacks the image until someone builds or pulls it.
	{err: roche.ErrImageNotFound, code: connect.CodeFailedPrecondition, reason: rochev1.ErrorReason_ERROR_REASON_IMAGE_NOT_FOUND, name: "image_not_found"},
	{err: roche.ErrNotFound, code: connect.CodeNotFound, reason: rochev1.ErrorReason_ERROR_REASON_NOT_FOUND, name: "not_found"},
	{err: roche.ErrInUse, code: connect.CodeFailedPrecondition, reason: rochev1.ErrorReason_ERROR_REASON_IN_USE, name: "in_use"},
	{err: roche.ErrPermission, code: connect.CodePermissionDenied, reason: rochev1.ErrorReason_ERROR_REASON_PERMISSION, name: "permission_denied"},
	{err: roche.ErrUnsupported, code: connect.CodeUnimplemented, reason: rochev1.ErrorReason_ERROR_REASON_UNSUPPORTED, name: "unsupported"},
	{err: roche.ErrUnavailable, code: connect.CodeUnavailable, reason: rochev1.ErrorReason_ERROR_REASON_UNAVAILABLE, name: "unavailable"},
	{err: roche.ErrTimeout, code: connect.CodeDeadlineExceeded, reason: rochev1.ErrorReason_ERROR_REASON_TIMEOUT, name: "timeout"},
	{err: roche.ErrOutputGone, code: connect.CodeOutOfRange, reason: rochev1.ErrorReason_ERROR_REASON_OUTPUT_GONE, name: "output_gone"},
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
	// A fix the error carries is worded for an API caller: what to set, and that it is
	// made on roched's host (roche.Remedy).
	msg := err
	if advice := remedy.Advise(err, remedy.ForClient); advice != err.Error() {
		msg = errors.New(advice)
	}
	e := connect.NewError(code, msg)
	if reason != rochev1.ErrorReason_ERROR_REASON_UNSPECIFIED {
		if d, derr := connect.NewErrorDetail(&rochev1.ErrorDetail{Reason: reason}); derr == nil {
			e.AddDetail(d)
		}
	}
	// A refusal that passes says when to ask again, in the detail gRPC clients know.
	if after, ok := roche.RetryDelay(err); ok {
		if d, derr := connect.NewErrorDetail(retryInfo(after)); derr == nil {
			e.AddDetail(d)
		}
	}
	return e
}

// RetryDelay returns the wait an RPC error's RetryInfo detail suggests, if it has one.
func RetryDelay(ce *connect.Error) (time.Duration, bool) {
	for _, d := range ce.Details() {
		if d.Type() == retryInfoType {
			return parseRetryInfo(d.Bytes())
		}
	}
	return 0, false
}

// retryInfoType is google.rpc.RetryInfo, whose one field, retry_delay (1), is a
// google.protobuf.Duration (seconds 1, nanos 2). It is written and read here with
// protowire, in the standard encoding, so that the thin CLI need not link genproto's
// error details for one field.
const retryInfoType = "google.rpc.RetryInfo"

func retryInfo(d time.Duration) *anypb.Any {
	var dur []byte
	if s := int64(d / time.Second); s != 0 {
		dur = protowire.AppendTag(dur, 1, protowire.VarintType)
		dur = protowire.AppendVarint(dur, uint64(s))
	}
	if n := int32(d % time.Second); n != 0 {
		dur = protowire.AppendTag(dur, 2, protowire.VarintType)
		dur = protowire.AppendVarint(dur, uint64(n))
	}
	b := protowire.AppendTag(nil, 1, protowire.BytesType)
	b = protowire.AppendBytes(b, dur)
	return &anypb.Any{TypeUrl: "type.googleapis.com/" + retryInfoType, Value: b}
}

// parseRetryInfo reads a RetryInfo's retry_delay; ok is false when it has none or does
// not parse.
func parseRetryInfo(b []byte) (d time.Duration, ok bool) {
	parsed := eachField(b, func(num protowire.Number, _ uint64, dur []byte) {
		if num != 1 {
			return
		}
		var secs, nanos int64
		ok = eachField(dur, func(num protowire.Number, v uint64, _ []byte) {
			switch num {
			case 1:
				secs = int64(v)
			case 2:
				nanos = int64(int32(v))
			}
		})
		d = time.Duration(secs)*time.Second + time.Duration(nanos)
		// A wait is never negative, nor past what a Duration holds (the multiplication
		// above would wrap): such a delay is not one.
		if secs < 0 || nanos < 0 || nanos >= int64(time.Second) || secs > math.MaxInt64/int64(time.Second)-1 {
			ok = false
		}
	})
	return d, parsed && ok
}

// eachField calls f with the number and value of each field of the message b: a
// varint's value, or a length-delimited field's bytes (other kinds are skipped). It
// returns false when b does not parse.
func eachField(b []byte, f func(num protowire.Number, v uint64, bytes []byte)) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		var v uint64
		var bytes []byte
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			bytes, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return false
		}
		b = b[n:]
		f(num, v, bytes)
	}
	return true
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
					if s.back != nil {
						return s.back, true
					}
					return s.err, true
				}
			}
		}
	}
	var found error
	for _, s := range sentinels {
		if s.code != ce.Code() || s.detailOnly {
			continue
		}
		if found != nil {
			return nil, false // FAILED_PRECONDITION stands for more than one
		}
		found = s.err
	}
	return found, false
}

// SkippedToProto is what a list or count across providers sends of the providers it
// skipped (err a *roche.PartialError), or nil.
func SkippedToProto(err error) []*rochev1.SkippedProvider {
	var pe *roche.PartialError
	if !errors.As(err, &pe) {
		return nil
	}
	out := make([]*rochev1.SkippedProvider, 0, len(pe.Skipped))
	for _, s := range pe.Skipped {
		reason := rochev1.ErrorReason_ERROR_REASON_UNSPECIFIED
		for _, row := range sentinels {
			if errors.Is(s.Err, row.err) {
				reason = row.reason
				break
			}
		}
		out = append(out, &rochev1.SkippedProvider{Provider: s.Provider, Reason: reason, Message: s.Err.Error()})
	}
	return out
}

// SkippedFromProto is the *roche.PartialError a response's skipped providers stand for,
// or nil when it skipped none.
func SkippedFromProto(skipped []*rochev1.SkippedProvider) error {
	if len(skipped) == 0 {
		return nil
	}
	pe := &roche.PartialError{}
	for _, s := range skipped {
		var sentinel error
		for _, row := range sentinels {
			if row.reason == s.Reason {
				sentinel = cmp.Or(row.back, row.err)
				break
			}
		}
		pe.Skipped = append(pe.Skipped, roche.SkippedProvider{Provider: s.Provider, Err: &skippedErr{msg: s.Message, sentinel: sentinel}})
	}
	return pe
}

// skippedErr is a skipped provider's error as it came: its text, and its sentinel.
type skippedErr struct {
	msg      string
	sentinel error
}

func (e *skippedErr) Error() string { return e.msg }
func (e *skippedErr) Unwrap() error { return e.sentinel }
