package wire

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
)

// CommandRequestToProto asks for req to start in sandbox id.
func CommandRequestToProto(id string, req roche.CommandRequest) *rochev1.StartCommandRequest {
	return &rochev1.StartCommandRequest{
		SandboxId: id, Cmd: req.Cmd, Env: req.Env, Workdir: req.Workdir, TimeoutSecs: req.Timeout.Seconds(),
		Tag: req.Tag, Stdin: req.Stdin, Window: req.Window, IdempotencyKey: req.IdempotencyKey,
	}
}

// CommandRequestFromProto is CommandRequestToProto's inverse, refusing what
// roche.CommandRequest.Validate refuses.
func CommandRequestFromProto(pb *rochev1.StartCommandRequest) (roche.CommandRequest, error) {
	timeout, err := ExecTimeout(pb.GetTimeoutSecs())
	if err != nil {
		return roche.CommandRequest{}, err
	}
	req := roche.CommandRequest{
		Cmd: pb.GetCmd(), Env: pb.GetEnv(), Workdir: pb.GetWorkdir(), Timeout: timeout,
		Tag: pb.GetTag(), Stdin: pb.GetStdin(), Window: pb.GetWindow(), IdempotencyKey: pb.GetIdempotencyKey(),
	}
	return req, req.Validate()
}

// SelectorToProto names a command.
func SelectorToProto(s roche.CommandSelector) *rochev1.CommandSelector {
	if s.PID != 0 {
		return &rochev1.CommandSelector{Selector: &rochev1.CommandSelector_Pid{Pid: uint32(s.PID)}}
	}
	return &rochev1.CommandSelector{Selector: &rochev1.CommandSelector_Tag{Tag: s.Tag}}
}

// SelectorFromProto is SelectorToProto's inverse, refusing a selector that names
// nothing.
func SelectorFromProto(pb *rochev1.CommandSelector) (roche.CommandSelector, error) {
	var s roche.CommandSelector
	switch sel := pb.GetSelector().(type) {
	case *rochev1.CommandSelector_Pid:
		if sel.Pid > 1<<31-1 {
			return s, fmt.Errorf("%w: pid %d is not a process id", roche.ErrInvalidConfig, sel.Pid)
		}
		s.PID = int(sel.Pid)
	case *rochev1.CommandSelector_Tag:
		s.Tag = sel.Tag
	}
	return s, s.Validate()
}

// OffsetsToProto converts stream offsets.
func OffsetsToProto(o roche.CommandOffsets) *rochev1.CommandOffsets {
	return &rochev1.CommandOffsets{Stdout: o.Stdout, Stderr: o.Stderr}
}

// OffsetsFromProto is OffsetsToProto's inverse; missing offsets are zero.
func OffsetsFromProto(pb *rochev1.CommandOffsets) roche.CommandOffsets {
	return roche.CommandOffsets{Stdout: pb.GetStdout(), Stderr: pb.GetStderr()}
}

// CommandEndToProto says how a command ended.
func CommandEndToProto(e roche.CommandEnd) *rochev1.CommandEnd {
	return &rochev1.CommandEnd{
		ExitCode: int32(e.ExitCode), Signal: int32(e.Signal), TimedOut: e.TimedOut, OomKilled: e.OOMKilled,
		Duration: durationpb.New(e.Duration), Unknown: e.Unknown,
	}
}

// CommandEndFromProto is CommandEndToProto's inverse. A missing end is an unknown exit
// status, never exit 0.
func CommandEndFromProto(pb *rochev1.CommandEnd) roche.CommandEnd {
	if pb == nil {
		return roche.CommandEnd{ExitCode: -1, Unknown: "roched sent no end"}
	}
	var d time.Duration
	if pb.Duration != nil {
		d = pb.Duration.AsDuration()
	}
	return roche.CommandEnd{
		ExitCode: int(pb.ExitCode), Signal: int(pb.Signal), TimedOut: pb.TimedOut, OOMKilled: pb.OomKilled,
		Duration: d, Unknown: pb.Unknown,
	}
}

// CommandToProto describes a durable command.
func CommandToProto(c roche.Command) *rochev1.Command {
	pb := &rochev1.Command{
		Pid: uint32(c.PID), Tag: c.Tag, Cmd: c.Cmd, Env: c.Env, Workdir: c.Workdir, Tty: c.TTY, Stdin: c.Stdin,
		Running: c.Running, StartedAt: timeToProto(c.StartedAt), Window: c.Window,
		First: OffsetsToProto(c.First), Written: OffsetsToProto(c.Written), Existing: c.Existing,
	}
	if c.End != nil {
		pb.End = CommandEndToProto(*c.End)
	}
	return pb
}

// CommandFromProto is CommandToProto's inverse.
func CommandFromProto(pb *rochev1.Command) roche.Command {
	c := roche.Command{
		PID: int(pb.GetPid()), Tag: pb.GetTag(), Cmd: pb.GetCmd(), Env: pb.GetEnv(), Workdir: pb.GetWorkdir(),
		TTY: pb.GetTty(), Stdin: pb.GetStdin(), Running: pb.GetRunning(), StartedAt: timeFromProto(pb.GetStartedAt()),
		Window: pb.GetWindow(), First: OffsetsFromProto(pb.GetFirst()), Written: OffsetsFromProto(pb.GetWritten()),
		Existing: pb.GetExisting(),
	}
	if pb.GetEnd() != nil {
		end := CommandEndFromProto(pb.GetEnd())
		c.End = &end
	}
	return c
}

// StartToProto opens a ConnectCommand stream.
func StartToProto(st roche.CommandStart) *rochev1.CommandStart {
	return &rochev1.CommandStart{Pid: uint32(st.PID), Tag: st.Tag, StdoutOffset: st.From.Stdout, StderrOffset: st.From.Stderr}
}

// StartFromProto is StartToProto's inverse. Existing does not cross: a connection is
// never a start.
func StartFromProto(pb *rochev1.CommandStart) roche.CommandStart {
	return roche.CommandStart{
		PID: int(pb.GetPid()), Tag: pb.GetTag(),
		From: roche.CommandOffsets{Stdout: pb.GetStdoutOffset(), Stderr: pb.GetStderrOffset()},
	}
}

// StreamToProto names an output stream.
func StreamToProto(s roche.Stream) rochev1.OutputStream {
	if s == roche.StreamStderr {
		return rochev1.OutputStream_OUTPUT_STREAM_STDERR
	}
	return rochev1.OutputStream_OUTPUT_STREAM_STDOUT
}

// StreamFromProto is StreamToProto's inverse.
func StreamFromProto(s rochev1.OutputStream) roche.Stream {
	if s == rochev1.OutputStream_OUTPUT_STREAM_STDERR {
		return roche.StreamStderr
	}
	return roche.StreamStdout
}
