package daemon

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/api/roche/v1/rochev1connect"
)

// TestMalformedStreamsAreInvalidArgument sends roched what the fault matrix did: a
// CopyTo whose chunk is not a tar stream, and ExecStream and CopyTo requests whose
// Connect envelope is cut short (its prefix, or its body). Each is the caller's fault,
// INVALID_ARGUMENT saying what was wrong, never INTERNAL; nothing is written or run.
func TestMalformedStreamsAreInvalidArgument(t *testing.T) {
	td := startDaemon(t, Config{})
	ctx := ctxFor(t, 2*time.Minute)
	sb, err := td.p.Create(ctx, pyConfig())
	if err != nil {
		t.Fatal(err)
	}
	hc := unixHTTP(td.socket)
	defer hc.CloseIdleConnections()

	api := rochev1connect.NewSandboxServiceClient(hc, "http://roched")
	up := api.CopyTo(ctx)
	if err := up.Send(&rochev1.CopyToRequest{SandboxId: sb.ID, Dst: "/tmp/x", TarChunk: []byte("this is not a tar stream, " + strings.Repeat("x", 1000))}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	_, err = up.CloseAndReceive()
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "send a tar stream") {
		t.Errorf("CopyTo of a chunk that is not tar: %v (%v), want invalid_argument saying to send a tar stream", err, connect.CodeOf(err))
	}

	execReq, _ := json.Marshal(map[string]any{"sandbox_id": sb.ID, "cmd": []string{"touch", "/tmp/ran"}})
	copyReq, _ := json.Marshal(map[string]any{"sandbox_id": sb.ID, "dst": "/tmp/y"})
	for _, c := range []struct {
		name, method string
		body         []byte
	}{
		{"ExecStream, prefix cut", "ExecStream", envelope(execReq)[:3]},
		{"ExecStream, body cut", "ExecStream", envelope(execReq)[:5+len(execReq)/2]},
		{"CopyTo, body cut", "CopyTo", envelope(copyReq)[:5+len(copyReq)/2]},
	} {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://roched/roche.v1.SandboxService/"+c.method, bytes.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/connect+json")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		// A Connect stream's error comes in its end-of-stream message.
		if !strings.Contains(string(b), `"code":"invalid_argument"`) || !strings.Contains(string(b), "ended mid-message") {
			t.Errorf("%s: %s %q, want invalid_argument saying the request ended mid-message", c.name, resp.Status, b)
		}
	}

	res, err := td.p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"ls", "/tmp"}})
	if err != nil || res.Stdout != "" {
		t.Errorf("after the malformed requests /tmp holds %q (%v), want nothing", res.Stdout, err)
	}
}

// envelope frames msg as one Connect streaming message: a flags byte, its length, it.
func envelope(msg []byte) []byte {
	b := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}
