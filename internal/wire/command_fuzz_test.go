package wire

import (
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
)

// FuzzCommandFromProto converts any message bytes as the daemon converts a
// StartCommand request and a command selector: what a conversion accepts converts back
// and forth unchanged, and a selector accepted names exactly one command.
func FuzzCommandFromProto(f *testing.F) {
	marshal := func(m proto.Message) []byte { b, _ := proto.Marshal(m); return b }
	f.Add(uint8(0), marshal(CommandRequestToProto("s", roche.CommandRequest{
		Cmd: []string{"sh", "-c", "echo hi"}, Env: map[string]string{"K": "v"}, Workdir: "/tmp",
		Timeout: 1500 * time.Millisecond, Tag: "srv", Stdin: true, Window: 1 << 20, IdempotencyKey: "k1",
	})))
	f.Add(uint8(0), marshal(&rochev1.StartCommandRequest{Cmd: []string{"true"}, Window: -1}))
	f.Add(uint8(1), marshal(SelectorToProto(roche.CommandSelector{PID: 42})))
	f.Add(uint8(1), marshal(SelectorToProto(roche.CommandSelector{Tag: "srv"})))
	f.Fuzz(func(t *testing.T, which uint8, b []byte) {
		switch which % 2 {
		case 0:
			var pb rochev1.StartCommandRequest
			if proto.Unmarshal(b, &pb) != nil {
				return
			}
			r, err := CommandRequestFromProto(&pb)
			if err != nil {
				return
			}
			again, err := CommandRequestFromProto(CommandRequestToProto(pb.SandboxId, r))
			if err != nil || !reflect.DeepEqual(again, r) {
				t.Fatalf("start %+v comes back as %+v (%v)", r, again, err)
			}
		case 1:
			var pb rochev1.CommandSelector
			if proto.Unmarshal(b, &pb) != nil {
				return
			}
			sel, err := SelectorFromProto(&pb)
			if err != nil {
				return
			}
			if (sel.PID == 0) == (sel.Tag == "") || sel.PID < 0 {
				t.Fatalf("selector %+v accepted: it must name one command", sel)
			}
			if again, err := SelectorFromProto(SelectorToProto(sel)); err != nil || again != sel {
				t.Fatalf("selector %+v comes back as %+v (%v)", sel, again, err)
			}
		}
	})
}
