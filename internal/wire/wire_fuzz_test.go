package wire

import (
	"bytes"
	"io"
	"net/http"
	"reflect"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
)

// wireSeeds are messages as clients send them, one per conversion FuzzFromProto tries.
func wireSeeds() [][]byte {
	cfg := roche.DefaultConfig()
	cfg.Env = map[string]string{"A": "1"}
	cfg.Mounts = []roche.Mount{{Source: "/src", Target: "/dst", ReadWrite: true}}
	cfg.NetworkAllowlist = []string{"pypi.org"}
	marshal := func(m proto.Message) []byte { b, _ := proto.Marshal(m); return b }
	return [][]byte{
		marshal(ConfigToProto(cfg, true)),
		marshal(ExecToProto("s", roche.ExecRequest{Cmd: []string{"echo", "hi"}, Env: map[string]string{"K": "v"}, Workdir: "/tmp",
			Timeout: 1500 * time.Millisecond, OutputLimit: 1 << 20}, []byte("stdin"))),
		marshal(CodeToProto("s", roche.CodeRequest{Code: "1+1", Language: "python", Timeout: time.Second, Cwd: "/tmp"})),
		marshal(TerminalToProto("s", roche.TerminalRequest{Cmd: []string{"bash"}, Size: roche.TerminalSize{Cols: 80, Rows: 24}})),
		retryInfo(1500 * time.Millisecond).Value,
		marshal(&rochev1.ExecRequest{TimeoutSecs: 1e300}),
		marshal(&rochev1.SandboxConfig{TimeoutSecs: proto.Int32(-1), PidsLimit: proto.Int32(1 << 30)}),
		// From here on retry delays and trailers.
		{0x0a, 0x0a, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f},       // retry_delay of 2^63-1 seconds
		{0x0a, 0x0b, 0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, // nanos of -1
		[]byte("-5"),
	}
}

// FuzzFromProto converts any message bytes as the daemon converts a request (a sandbox
// config, an exec, a cell, a terminal) and as the client reads a retry delay. What a
// conversion accepts and the core validates converts back and forth unchanged: the
// client and the daemon mean the same request. A retry delay read is never negative,
// and one written reads back as written.
func FuzzFromProto(f *testing.F) {
	for i, s := range wireSeeds() {
		f.Add(uint8(min(i, 4)), s)
	}
	f.Add(uint8(1), wireSeeds()[5])
	f.Add(uint8(0), wireSeeds()[6])
	f.Fuzz(func(t *testing.T, which uint8, b []byte) {
		switch which % 5 {
		case 0:
			var pb rochev1.SandboxConfig
			if proto.Unmarshal(b, &pb) != nil {
				return
			}
			cfg, leased := ConfigFromProto(&pb)
			if cfg.Validate() != nil {
				return
			}
			if again, alsoLeased := ConfigFromProto(ConfigToProto(cfg, leased)); !reflect.DeepEqual(again, cfg) || alsoLeased != leased {
				t.Fatalf("config %+v (leased %v) comes back as %+v (leased %v)", cfg, leased, again, alsoLeased)
			}
		case 1:
			var pb rochev1.ExecRequest
			if proto.Unmarshal(b, &pb) != nil {
				return
			}
			req, err := ExecFromProto(&pb)
			if err != nil || req.Validate() != nil {
				return
			}
			var stdin []byte
			if req.Stdin != nil {
				stdin, _ = io.ReadAll(req.Stdin)
				if stdin == nil {
					stdin = []byte{}
				}
			}
			again, err := ExecFromProto(ExecToProto(pb.SandboxId, req, stdin))
			if err != nil {
				t.Fatalf("exec %+v does not convert back: %v", req, err)
			}
			var stdin2 []byte
			if again.Stdin != nil {
				stdin2, _ = io.ReadAll(again.Stdin)
			}
			if !slices.Equal(again.Cmd, req.Cmd) || !reflect.DeepEqual(again.Env, req.Env) || again.Workdir != req.Workdir ||
				again.Timeout != req.Timeout || again.OutputLimit != req.OutputLimit || !bytes.Equal(stdin, stdin2) ||
				(again.Stdin == nil) != (req.Stdin == nil) {
				t.Fatalf("exec %+v comes back as %+v", req, again)
			}
		case 2:
			var pb rochev1.RunCodeRequest
			if proto.Unmarshal(b, &pb) != nil {
				return
			}
			r, err := CodeFromProto(&pb)
			if err != nil {
				return
			}
			again, err := CodeFromProto(CodeToProto(pb.SandboxId, r))
			if err != nil || !reflect.DeepEqual(again, r) {
				t.Fatalf("cell %+v comes back as %+v (%v)", r, again, err)
			}
		case 3:
			var pb rochev1.CreatePtyRequest
			if proto.Unmarshal(b, &pb) != nil {
				return
			}
			r, err := TerminalFromProto(&pb)
			if err != nil {
				return
			}
			again, err := TerminalFromProto(TerminalToProto(pb.SandboxId, r))
			if err != nil || !reflect.DeepEqual(again, r) {
				t.Fatalf("terminal %+v comes back as %+v (%v)", r, again, err)
			}
		case 4:
			d, ok := parseRetryInfo(b)
			if ok && d < 0 {
				t.Fatalf("a retry delay of %v", d)
			}
			if ok {
				if again, ok := parseRetryInfo(retryInfo(d).Value); !ok || again != d {
					t.Fatalf("a retry delay of %v reads back as %v (%v)", d, again, ok)
				}
			}
			// The copy report in a trailer: whatever the values, reading them never
			// yields a negative count.
			h := http.Header{}
			h.Set(trailerSkipped, string(b))
			h.Set(trailerSkippedLinks, string(b))
			h.Add(trailerExample, string(b))
			if r := Skipped(h); r.Skipped < 0 || r.SkippedLinks < 0 {
				t.Fatalf("trailer %q reads as %d skipped, %d links", b, r.Skipped, r.SkippedLinks)
			}
		}
	})
}
