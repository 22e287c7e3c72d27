package wire

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
)

func TestCommandsGoToProtoAndBack(t *testing.T) {
	t.Run("StartCommand", func(t *testing.T) {
		roundTrip(t, func(r roche.CommandRequest) roche.CommandRequest {
			r.Workdir = "/x" // a valid one; fillGo's would be refused
			got, err := CommandRequestFromProto(CommandRequestToProto("sb", r))
			if err != nil {
				t.Fatal(err)
			}
			got.Workdir = "x-string"
			return got
		})
	})
	roundTrip(t, func(c roche.Command) roche.Command { return CommandFromProto(CommandToProto(c)) })
	roundTrip(t, func(e roche.CommandEnd) roche.CommandEnd { return CommandEndFromProto(CommandEndToProto(e)) })
	roundTrip(t, func(o roche.CommandOffsets) roche.CommandOffsets { return OffsetsFromProto(OffsetsToProto(o)) })
	for _, sel := range []roche.CommandSelector{{PID: 42}, {Tag: "server"}} {
		got, err := SelectorFromProto(SelectorToProto(sel))
		if err != nil || got != sel {
			t.Errorf("selector %+v came back %+v, %v", sel, got, err)
		}
	}
	st := roche.CommandStart{PID: 7, Tag: "t", From: roche.CommandOffsets{Stdout: 3, Stderr: 4}}
	if got := StartFromProto(StartToProto(st)); got != st {
		t.Errorf("start %+v came back %+v", st, got)
	}
	for _, s := range []roche.Stream{roche.StreamStdout, roche.StreamStderr} {
		if got := StreamFromProto(StreamToProto(s)); got != s {
			t.Errorf("stream %v came back %v", s, got)
		}
	}
}

func TestCommandsProtoToGoAndBack(t *testing.T) {
	check := func(want proto.Message, there func(proto.Message) proto.Message) {
		t.Helper()
		fillProto(want.ProtoReflect())
		got := there(want)
		fields := want.ProtoReflect().Descriptor().Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			if w, g := want.ProtoReflect().Get(fd), got.ProtoReflect().Get(fd); !g.Equal(w) {
				t.Errorf("%s.%s did not survive the core's types: sent %v, got %v",
					want.ProtoReflect().Descriptor().Name(), fd.Name(), w, g)
			}
		}
	}
	check(&rochev1.Command{}, func(m proto.Message) proto.Message { return CommandToProto(CommandFromProto(m.(*rochev1.Command))) })
	check(&rochev1.CommandEnd{}, func(m proto.Message) proto.Message {
		return CommandEndToProto(CommandEndFromProto(m.(*rochev1.CommandEnd)))
	})
	check(&rochev1.StartCommandRequest{}, func(m proto.Message) proto.Message {
		pb := m.(*rochev1.StartCommandRequest)
		pb.Workdir, pb.Window, pb.TimeoutSecs = "/x", 4096, 2
		r, err := CommandRequestFromProto(pb)
		if err != nil {
			t.Fatal(err)
		}
		return CommandRequestToProto(pb.SandboxId, r)
	})
}

// TestCommandRefusals: a start or a selector the core refuses is refused at the wire.
func TestCommandRefusals(t *testing.T) {
	for name, pb := range map[string]*rochev1.StartCommandRequest{
		"no command":    {SandboxId: "sb"},
		"window":        {SandboxId: "sb", Cmd: []string{"true"}, Window: roche.MaxCommandWindow + 1},
		"timeout":       {SandboxId: "sb", Cmd: []string{"true"}, TimeoutSecs: -1},
		"long tag":      {SandboxId: "sb", Cmd: []string{"true"}, Tag: string(make([]byte, roche.MaxTagBytes+1))},
		"long key":      {SandboxId: "sb", Cmd: []string{"true"}, IdempotencyKey: string(make([]byte, roche.MaxIdempotencyKeyBytes+1))},
		"relative cwd":  {SandboxId: "sb", Cmd: []string{"true"}, Workdir: "tmp"},
		"negative size": {SandboxId: "sb", Cmd: []string{"true"}, Window: -1},
	} {
		if _, err := CommandRequestFromProto(pb); !errors.Is(err, roche.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := SelectorFromProto(nil); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Errorf("no selector: %v", err)
	}
	if _, err := SelectorFromProto(&rochev1.CommandSelector{Selector: &rochev1.CommandSelector_Pid{Pid: 1 << 31}}); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Errorf("a pid past int32: %v", err)
	}
	if got := CommandEndFromProto(nil); got.Unknown == "" || got.ExitCode != -1 {
		t.Errorf("a missing end reads %+v, want unknown", got)
	}
}
