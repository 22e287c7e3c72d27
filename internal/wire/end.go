package wire

import (
	"strings"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
)

// EndKindToProto maps an end's kind onto the API's enum; one the enum lacks is unknown.
func EndKindToProto(k roche.EndKind) rochev1.EndKind {
	if v, ok := rochev1.EndKind_value["END_KIND_"+strings.ToUpper(string(k))]; ok && k != "" {
		return rochev1.EndKind(v)
	}
	return rochev1.EndKind_END_KIND_UNKNOWN
}

// EndKindFromProto is EndKindToProto's inverse; unspecified reads as unknown.
func EndKindFromProto(k rochev1.EndKind) roche.EndKind {
	name, ok := rochev1.EndKind_name[int32(k)]
	if !ok || k == rochev1.EndKind_END_KIND_UNSPECIFIED {
		return roche.EndUnknown
	}
	return roche.EndKind(strings.ToLower(strings.TrimPrefix(name, "END_KIND_")))
}

// EndToProto carries why a sandbox ended; nil stays nil.
func EndToProto(e *roche.EndReason) *rochev1.EndReason {
	if e == nil {
		return nil
	}
	return &rochev1.EndReason{
		Kind: EndKindToProto(e.Kind), At: timeToProto(e.At), Detail: e.Detail, Evidence: e.Evidence,
		By: e.By, ExitCode: int32(e.ExitCode), ExitKnown: e.ExitKnown,
	}
}

// EndFromProto is EndToProto's inverse.
func EndFromProto(pb *rochev1.EndReason) *roche.EndReason {
	if pb == nil {
		return nil
	}
	return &roche.EndReason{
		Kind: EndKindFromProto(pb.Kind), At: timeFromProto(pb.At), Detail: pb.Detail, Evidence: pb.Evidence,
		By: pb.By, ExitCode: int(pb.ExitCode), ExitKnown: pb.ExitKnown,
	}
}

// ReceiptToProto carries what a command used; nil stays nil.
func ReceiptToProto(r *roche.Receipt) *rochev1.ReceiptUsage {
	if r == nil {
		return nil
	}
	pb := &rochev1.ReceiptUsage{PeakMemoryBytes: r.PeakMemoryBytes, CpuTime: durationpb.New(r.CPUTime), LeftoverProcesses: int32(r.Leftover),
		Evidence: r.Evidence}
	if r.End != "" {
		pb.End = EndKindToProto(r.End)
	}
	return pb
}

// ReceiptFromProto is ReceiptToProto's inverse.
func ReceiptFromProto(pb *rochev1.ReceiptUsage) *roche.Receipt {
	if pb == nil {
		return nil
	}
	r := &roche.Receipt{PeakMemoryBytes: pb.PeakMemoryBytes, CPUTime: pb.CpuTime.AsDuration(), Leftover: int(pb.LeftoverProcesses),
		Evidence: pb.Evidence}
	if pb.End != rochev1.EndKind_END_KIND_UNSPECIFIED {
		r.End = EndKindFromProto(pb.End)
	}
	return r
}
