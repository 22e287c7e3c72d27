package wire

import (
	"errors"
	"reflect"
	"testing"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
)

func TestTerminalRoundTrip(t *testing.T) {
	req := roche.TerminalRequest{Cmd: []string{"python3"}, Env: map[string]string{"A": "b"}, Workdir: "/tmp",
		Size: roche.TerminalSize{Cols: 132, Rows: 43}}
	pb := TerminalToProto("sb", req)
	if pb.SandboxId != "sb" {
		t.Fatalf("sandbox id %q", pb.SandboxId)
	}
	back, err := TerminalFromProto(pb)
	if err != nil || !reflect.DeepEqual(back, req) {
		t.Fatalf("round trip: %+v %v, want %+v", back, err, req)
	}
	if _, err := TerminalFromProto(&rochev1.CreatePtyRequest{Size: &rochev1.PtySize{Cols: 70000}}); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Errorf("a size over the limit: %v, want invalid", err)
	}
	if _, err := TerminalFromProto(&rochev1.CreatePtyRequest{Workdir: "relative"}); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Errorf("a relative workdir: %v, want invalid", err)
	}
	if s, err := SizeFromProto(nil); err != nil || s != (roche.TerminalSize{}) {
		t.Errorf("no size: %+v %v, want the default", s, err)
	}
}
