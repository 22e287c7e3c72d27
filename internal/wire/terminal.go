package wire

import (
	"fmt"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
)

// TerminalToProto is a CreatePty request for sandbox id.
func TerminalToProto(id string, req roche.TerminalRequest) *rochev1.CreatePtyRequest {
	return &rochev1.CreatePtyRequest{
		SandboxId: id, Cmd: req.Cmd, Env: req.Env, Workdir: req.Workdir, Size: SizeToProto(req.Size),
	}
}

// TerminalFromProto is the core's request from a CreatePty request, checked.
func TerminalFromProto(pb *rochev1.CreatePtyRequest) (roche.TerminalRequest, error) {
	size, err := SizeFromProto(pb.GetSize())
	if err != nil {
		return roche.TerminalRequest{}, err
	}
	req := roche.TerminalRequest{Cmd: pb.GetCmd(), Env: pb.GetEnv(), Workdir: pb.GetWorkdir(), Size: size}
	return req, req.Validate()
}

// SizeToProto converts a terminal size.
func SizeToProto(s roche.TerminalSize) *rochev1.PtySize {
	return &rochev1.PtySize{Cols: uint32(s.Cols), Rows: uint32(s.Rows)}
}

// SizeFromProto converts a terminal size, refusing one over roche.MaxTerminalSide (a
// nil size is zero: the default).
func SizeFromProto(pb *rochev1.PtySize) (roche.TerminalSize, error) {
	if pb.GetCols() > roche.MaxTerminalSide || pb.GetRows() > roche.MaxTerminalSide {
		return roche.TerminalSize{}, fmt.Errorf("%w: terminal size %dx%d is over %d on a side",
			roche.ErrInvalidConfig, pb.GetCols(), pb.GetRows(), roche.MaxTerminalSide)
	}
	return roche.TerminalSize{Cols: uint16(pb.GetCols()), Rows: uint16(pb.GetRows())}, nil
}
