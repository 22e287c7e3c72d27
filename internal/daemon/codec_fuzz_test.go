package daemon

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protopath"
	"google.golang.org/protobuf/reflect/protorange"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/internal/wire"
	"github.com/roche-sandbox/roche/provider/kit"
)

// requestTypes are the request messages of every method of roche.v1.SandboxService.
func requestTypes() []protoreflect.MessageType {
	var out []protoreflect.MessageType
	methods := rochev1.File_roche_v1_sandbox_proto.Services().ByName("SandboxService").Methods()
	for i := 0; i < methods.Len(); i++ {
		mt, err := protoregistry.GlobalTypes.FindMessageByName(methods.Get(i).Input().FullName())
		if err != nil {
			panic(err)
		}
		out = append(out, mt)
	}
	return out
}

// hasUnknown reports whether m or any message in it holds a field its schema lacks,
// walking it with protorange rather than with the codec's own walk.
func hasUnknown(m proto.Message) bool {
	found := false
	_ = protorange.Range(m.ProtoReflect(), func(v protopath.Values) error {
		last := v.Index(-1)
		if msg, ok := last.Value.Interface().(protoreflect.Message); ok && len(msg.GetUnknown()) > 0 {
			found = true
			return protorange.Terminate
		}
		return nil
	})
	return found
}

// codecSeeds are request bodies of the shapes clients send, in both encodings.
func codecSeeds() [][2]any {
	cfg := wire.ConfigToProto(roche.DefaultConfig(), false)
	msgs := []proto.Message{
		&rochev1.CreateRequest{Provider: "docker", Config: cfg},
		&rochev1.ExecRequest{SandboxId: "s", Cmd: []string{"python3", "-c", "print(1)"}, Env: map[string]string{"A": "1"}, Stdin: []byte("in")},
		&rochev1.ExecStreamRequest{SandboxId: "s", Cmd: []string{"sh"}},
		&rochev1.CopyToRequest{SandboxId: "s", Dst: "/tmp/x", TarChunk: []byte("chunk"), MaxBytes: 10},
		&rochev1.DestroyRequest{Ids: []string{"a", "b"}},
	}
	var out [][2]any
	for _, m := range msgs {
		b, _ := proto.Marshal(m)
		j, _ := strictJSON{}.Marshal(m)
		name := string(m.ProtoReflect().Descriptor().Name())
		out = append(out, [2]any{name, b}, [2]any{name, j})
	}
	// An unknown field (number 99) inside the config, and a typo in JSON.
	b, _ := proto.Marshal(&rochev1.CreateRequest{Provider: "docker", Config: cfg})
	inner := protowireAppendUnknown(nil)
	out = append(out, [2]any{"CreateRequest", append(b, inner...)})
	out = append(out, [2]any{"CreateRequest", []byte(`{"provider":"docker","config":{"memroy":"4g"}}`)})
	return out
}

// protowireAppendUnknown appends field 99, varint 1: a field no message of roche.v1 has.
func protowireAppendUnknown(b []byte) []byte { return append(b, 0x98, 0x06, 0x01) }

// FuzzCodecs decodes any bytes as any request of the API with the strict codecs: a
// message they accept holds no field the schema lacks, anywhere (checked by a walk of
// its own), and encodes back, in either encoding, to one they decode to the same; one
// the binary codec refuses for an unknown field holds one.
func FuzzCodecs(f *testing.F) {
	types := requestTypes()
	index := map[string]int{}
	for i, mt := range types {
		index[string(mt.Descriptor().Name())] = i
	}
	for _, s := range codecSeeds() {
		b := s[1].([]byte)
		f.Add(uint8(index[s[0].(string)]), len(b) > 0 && b[0] == '{', b)
	}
	f.Fuzz(func(t *testing.T, which uint8, asJSON bool, b []byte) {
		mt := types[int(which)%len(types)]
		m := mt.New().Interface()
		var codec interface {
			Marshal(any) ([]byte, error)
			Unmarshal([]byte, any) error
		} = strictProto{}
		if asJSON {
			codec = strictJSON{"json"}
		}
		err := codec.Unmarshal(b, m)
		if !asJSON {
			lax := mt.New().Interface()
			if proto.Unmarshal(b, lax) == nil {
				unknown := hasUnknown(lax)
				if err == nil && unknown {
					t.Fatalf("%s: the strict codec accepted a message with an unknown field", mt.Descriptor().Name())
				}
				if err != nil && !unknown {
					t.Fatalf("%s: the strict codec refused a message without unknown fields: %v", mt.Descriptor().Name(), err)
				}
			}
		}
		if err != nil {
			return
		}
		for _, c := range []interface {
			Marshal(any) ([]byte, error)
			Unmarshal([]byte, any) error
		}{strictProto{}, strictJSON{"json"}} {
			out, err := c.Marshal(m)
			if err != nil {
				// protojson refuses what proto accepts in one case: a string field that
				// is not UTF-8 (proto3 validates it too, so this is a bug if it happens).
				t.Fatalf("%s: an accepted message does not encode: %v", mt.Descriptor().Name(), err)
			}
			again := mt.New().Interface()
			if err := c.Unmarshal(out, again); err != nil {
				t.Fatalf("%s: %T's own encoding does not decode: %v\n%s", mt.Descriptor().Name(), c, err, out)
			}
			if !proto.Equal(m, again) {
				t.Fatalf("%s: %T round trip changed the message", mt.Descriptor().Name(), c)
			}
		}
	})
}

// fuzzProvider is the in-memory provider behind the daemon the API fuzz target calls:
// it records what reaches it, which must always be what the daemon's checks allow.
type fuzzProvider struct {
	memProvider
	mu       sync.Mutex
	problems []string
	uploads  [][]byte
}

func (p *fuzzProvider) problem(format string, args ...any) {
	p.mu.Lock()
	p.problems = append(p.problems, fmt.Sprintf(format, args...))
	p.mu.Unlock()
}

func (p *fuzzProvider) Create(ctx context.Context, cfg roche.Config) (roche.SandboxInfo, error) {
	return p.CreateFor(ctx, cfg, kit.CreateOptions{})
}

func (p *fuzzProvider) CreateFor(ctx context.Context, cfg roche.Config, opts kit.CreateOptions) (roche.SandboxInfo, error) {
	if err := cfg.Validate(); err != nil {
		p.problem("Create reached the provider with an invalid config: %v", err)
	}
	return p.memProvider.CreateFor(ctx, cfg, opts)
}

func (p *fuzzProvider) Exec(ctx context.Context, id string, req roche.ExecRequest) (roche.ExecResult, error) {
	if err := req.Validate(); err != nil {
		p.problem("Exec reached the provider with an invalid request: %v", err)
	}
	if req.Stdout != nil {
		_, _ = io.WriteString(req.Stdout, "output\n")
	}
	return p.memProvider.Exec(ctx, id, req)
}

func (p *fuzzProvider) CopyTarTo(_ context.Context, _, dst string, r io.Reader) error {
	b, err := io.ReadAll(io.LimitReader(r, 64<<20))
	p.mu.Lock()
	p.uploads = append(p.uploads, append([]byte(dst+"\x00"), b...))
	p.mu.Unlock()
	return err
}

func (p *fuzzProvider) CopyTarFrom(context.Context, string, string, io.Writer) error {
	return errors.New("not in this test")
}

func (p *fuzzProvider) take() (problems []string, uploads [][]byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	problems, uploads = p.problems, p.uploads
	p.problems, p.uploads = nil, nil
	return
}

// Caps of the fuzzed daemon, small so that inputs reach them.
const (
	fuzzCopyMax   = 4 << 10
	fuzzUploadMax = 64 << 10
)

// framed frames a message as the Connect and gRPC-Web streaming protocols do.
func framed(flags byte, msg []byte) []byte {
	h := []byte{flags, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(h[1:], uint32(len(msg)))
	return append(h, msg...)
}

func seedTar(entries ...string) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i := 0; i+1 < len(entries); i += 2 {
		h := &tar.Header{Name: entries[i], Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(entries[i+1]))}
		if strings.HasPrefix(entries[i+1], "->") {
			h.Typeflag, h.Size, h.Linkname = tar.TypeSymlink, 0, entries[i+1][2:]
		}
		_ = tw.WriteHeader(h)
		if h.Typeflag == tar.TypeReg {
			_, _ = tw.Write([]byte(entries[i+1]))
		}
	}
	_ = tw.Close()
	return buf.Bytes()
}

// apiMethods are the methods FuzzAPI calls, with whether they stream.
var apiMethods = []struct {
	name      string
	streaming bool
}{{"Create", false}, {"Exec", false}, {"ExecStream", true}, {"CopyTo", true}}

// FuzzAPI sends any request body to a running daemon's handler, as Connect's unary and
// streaming protocols and gRPC-Web carry it, for the calls that reach a provider with
// what the caller sent: a create, an exec, a streamed exec, an upload. Whatever the
// body, the handler answers without panicking; the provider receives only configs and
// requests that pass their checks, and only uploads that are checked tar streams (one
// root named as the destination, files, directories and links only, within the copy
// cap); and an upload past the daemon's upload cap is refused.
func FuzzAPI(f *testing.F) {
	const id = "mem-0001"
	marshal := func(m proto.Message) []byte { b, _ := proto.Marshal(m); return b }
	cfg := wire.ConfigToProto(roche.DefaultConfig(), false)
	badCfg := wire.ConfigToProto(roche.DefaultConfig(), false)
	badCfg.Memory, badCfg.Env = proto.String("1m"), map[string]string{"A\x00": "x"}
	good := seedTar("x", "hello")
	f.Add(uint8(0), uint8(0), marshal(&rochev1.CreateRequest{Provider: "mem", Config: cfg}))
	f.Add(uint8(0), uint8(1), []byte(`{"provider":"mem","config":{"image":"img","memory":"1m","env":{"A\u0000":"x"}}}`))
	f.Add(uint8(0), uint8(0), marshal(&rochev1.CreateRequest{Provider: "mem", Config: badCfg}))
	f.Add(uint8(1), uint8(0), marshal(&rochev1.ExecRequest{SandboxId: id, Cmd: []string{"true"}, Stdin: []byte("in")}))
	f.Add(uint8(1), uint8(1), []byte(`{"sandboxId":"`+id+`","cmd":["a\u0000b"],"timeoutSecs":-1}`))
	f.Add(uint8(2), uint8(0), framed(0, marshal(&rochev1.ExecStreamRequest{SandboxId: id, Cmd: []string{"sh", "-c", "echo"}})))
	f.Add(uint8(2), uint8(2), framed(0, marshal(&rochev1.ExecStreamRequest{SandboxId: id, Cmd: []string{"x"}, Workdir: "rel"})))
	f.Add(uint8(3), uint8(0), framed(0, marshal(&rochev1.CopyToRequest{SandboxId: id, Dst: "/tmp/d", TarChunk: good})))
	f.Add(uint8(3), uint8(0), bytes.Join([][]byte{
		framed(0, marshal(&rochev1.CopyToRequest{SandboxId: id, Dst: "/tmp/d", TarChunk: good[:100]})),
		framed(0, marshal(&rochev1.CopyToRequest{TarChunk: good[100:]})),
	}, nil))
	f.Add(uint8(3), uint8(1), framed(0, []byte(`{"sandboxId":"`+id+`","dst":"/tmp/d","tarChunk":"`+
		b64(seedTar("x/../../etc/passwd", "root", "y", "->/etc", "z", strings.Repeat("a", 5000)))+`"}`)))
	f.Add(uint8(3), uint8(2), framed(0, marshal(&rochev1.CopyToRequest{SandboxId: id, Dst: "/", TarChunk: good})))
	f.Add(uint8(3), uint8(0), framed(0, marshal(&rochev1.CopyToRequest{SandboxId: id, Dst: "/tmp/d", TarChunk: make([]byte, fuzzUploadMax+1)})))
	f.Add(uint8(3), uint8(0), []byte{0, 0xff, 0xff, 0xff, 0xff})
	f.Add(uint8(3), uint8(0), []byte{2, 0, 0, 0, 2, '{', '}'})

	dir := shortDir(f)
	mp := &fuzzProvider{memProvider: memProvider{live: map[string]roche.SandboxInfo{}}}
	d, err := New(Config{Socket: filepath.Join(dir, "roched.sock"), CopyMaxBytes: fuzzCopyMax, MaxUploadBytes: fuzzUploadMax,
		HeartbeatInterval: time.Hour}, map[string]roche.Provider{"mem": mp})
	if err != nil {
		f.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.Start(ctx); err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, r := range d.ledger.Records() {
			_, _ = d.ledger.Destroy(&d.local.Tenant, r.ID)
		}
		_ = d.Shutdown(sctx)
	})
	if sb, _, err := d.ledger.Create(ctx, &d.local.Tenant, "mem", roche.DefaultConfig(), false); err != nil || sb.ID != id {
		f.Fatalf("the fuzzed daemon's sandbox: %s, %v", sb.ID, err)
	}
	h := d.handler(false)
	protocols := []struct{ unary, stream string }{
		{"application/proto", "application/connect+proto"},
		{"application/json", "application/connect+json"},
		{"application/grpc-web+proto", "application/grpc-web+proto"},
	}

	f.Fuzz(func(t *testing.T, which, protocol uint8, body []byte) {
		m := apiMethods[int(which)%len(apiMethods)]
		p := protocols[int(protocol)%len(protocols)]
		ct := p.unary
		if m.streaming {
			ct = p.stream
		}
		if strings.HasPrefix(ct, "application/grpc-web") && !m.streaming {
			body = framed(0, body) // gRPC-Web frames unary messages too
		}
		rctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		read := &countingReader{r: bytes.NewReader(body)}
		req := httptest.NewRequestWithContext(rctx, http.MethodPost, "/roche.v1.SandboxService/"+m.name, read)
		req.Header.Set("Content-Type", ct)
		if strings.HasPrefix(ct, "application/grpc-web") {
			req.Header.Set("X-Grpc-Web", "1")
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rctx.Err() != nil {
			t.Fatalf("%s did not answer within 20 s", m.name)
		}
		problems, uploads := mp.take()
		for _, p := range problems {
			t.Error(p)
		}
		for _, u := range uploads {
			dst, tarball, _ := bytes.Cut(u, []byte{0})
			checkUpload(t, string(dst), tarball)
		}
		if m.name == "CopyTo" && rec.Code == http.StatusOK && !strings.HasPrefix(ct, "application/grpc-web") {
			if chunks := uploadedBytes(body, p.stream == "application/connect+json"); chunks > fuzzUploadMax && connectOK(rec) {
				t.Errorf("an upload of %d bytes, over the cap of %d, succeeded", chunks, fuzzUploadMax)
			}
		}
		// Sandboxes a create made go at once: only the one the inputs name stays.
		for _, r := range d.ledger.Records() {
			if r.ID != id {
				// Not found: its lifetime (a create may ask for 1 s) ended first.
				if _, err := d.ledger.Destroy(&d.local.Tenant, r.ID); err != nil && !errors.Is(err, roche.ErrNotFound) {
					t.Fatalf("destroying %s: %v", r.ID, err)
				}
			}
		}
	})
}

func b64(b []byte) string {
	j, _ := json.Marshal(b)
	return strings.Trim(string(j), `"`)
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// connectOK reports whether a Connect streaming answer ended without an error: its
// last envelope (flags 2) holds no "error".
func connectOK(rec *httptest.ResponseRecorder) bool {
	b := rec.Body.Bytes()
	for len(b) >= 5 {
		flags, n := b[0], binary.BigEndian.Uint32(b[1:5])
		if uint32(len(b)-5) < n {
			return false
		}
		if flags&2 != 0 {
			return !bytes.Contains(b[5:5+n], []byte(`"error"`))
		}
		b = b[5+n:]
	}
	return false
}

// uploadedBytes sums the tar chunks of the CopyTo messages in a Connect streaming body,
// as far as it parses.
func uploadedBytes(body []byte, asJSON bool) int {
	total := 0
	for len(body) >= 5 {
		flags, n := body[0], binary.BigEndian.Uint32(body[1:5])
		if flags != 0 || uint32(len(body)-5) < n {
			break
		}
		var m rochev1.CopyToRequest
		var err error
		if asJSON {
			err = strictJSON{"json"}.Unmarshal(body[5:5+n], &m)
		} else {
			err = strictProto{}.Unmarshal(body[5:5+n], &m)
		}
		if err != nil {
			break
		}
		total += len(m.TarChunk)
		body = body[5+n:]
	}
	return total
}

// checkUpload checks a tar stream the daemon handed a provider: one root entry, named as
// the destination's base; clean relative names; files, directories and symlinks only;
// no more file content than the copy cap.
func checkUpload(t *testing.T, dst string, b []byte) {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	var total int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			// A stream cut short: the daemon stopped relaying at an error it reported.
			return
		}
		name := strings.TrimSuffix(h.Name, "/")
		if name != path.Base(dst) && !strings.HasPrefix(name, path.Base(dst)+"/") {
			t.Errorf("the provider got entry %q for a copy to %s", h.Name, dst)
		}
		if path.Clean(name) != name {
			t.Errorf("the provider got entry %q, not a clean name", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeReg:
			total += h.Size
		case tar.TypeDir, tar.TypeSymlink:
		default:
			t.Errorf("the provider got entry %q of type %q", h.Name, h.Typeflag)
		}
	}
	if total > fuzzCopyMax {
		t.Errorf("the provider got %d bytes of files, over the copy cap of %d", total, fuzzCopyMax)
	}
}

// TestEnvelopeAllocation bounds what a request's envelope header makes the daemon
// allocate: a header claiming more than the message limit costs nothing like it, and
// one within the limit whose message never comes costs no more than the limit.
func TestEnvelopeAllocation(t *testing.T) {
	mp := &fuzzProvider{memProvider: memProvider{live: map[string]roche.SandboxInfo{}}}
	d, err := New(Config{Socket: filepath.Join(shortDir(t), "roched.sock")}, map[string]roche.Provider{"mem": mp})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Shutdown(context.Background())
	h := d.handler(false)
	for _, c := range []struct {
		claim uint32
		max   uint64
	}{{1 << 31, 1 << 20}, {maxMessageBytes + 1, 1 << 20}, {maxMessageBytes - 1, maxMessageBytes + 1<<20}} {
		body := append([]byte{0, 0, 0, 0, 0}, "short"...)
		binary.BigEndian.PutUint32(body[1:], c.claim)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		req := httptest.NewRequest(http.MethodPost, "/roche.v1.SandboxService/CopyTo", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/connect+proto")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		runtime.ReadMemStats(&after)
		if got := after.TotalAlloc - before.TotalAlloc; got > c.max {
			t.Errorf("an envelope claiming %d bytes made the daemon allocate %d", c.claim, got)
		}
		if connectOK(rec) {
			t.Errorf("an envelope claiming %d bytes with 5 sent was accepted", c.claim)
		}
	}
}

// FuzzConfigFiles reads any bytes as a --config file and as a --tokens-file: what
// loads is exactly one JSON object of known fields (nothing after it: a second object
// appended by hand is an error, not silently dropped), and what a tokens file lists,
// the daemon's settings check.
func FuzzConfigFiles(f *testing.F) {
	for _, s := range []string{
		`{"socket": "/run/roche/roched.sock", "listen": "tcp://127.0.0.1:7878", "max_sandboxes": 100, "pools": ["docker/img?min=2"], "copy_max_bytes": "1g", "engine_timeout": "30s"}`,
		`{"tenants": [{"name": "alice", "token_sha256": "` + strings.Repeat("ab", 32) + `", "max_sandboxes": 3, "mount_roots": ["/srv"]}]}`,
		`{"tenants": []}`,
		`{"socket": "a"} {"socket": "b"}`,
		`{"tenants": [{"name": "a"}]}trailing`,
		`{"memroy": 1}`,
		`{"max_sandboxes": 1e400}`,
		`[]`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(t.TempDir(), "file.json")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		oneObject := func() bool {
			dec := json.NewDecoder(bytes.NewReader(b))
			var v map[string]json.RawMessage
			if dec.Decode(&v) != nil || v == nil {
				return false
			}
			_, err := dec.Token()
			return errors.Is(err, io.EOF)
		}
		if fc, err := LoadFileConfig(p); err == nil {
			if !oneObject() {
				t.Fatalf("config %q loaded, and is not one JSON object", b)
			}
			if !errors.Is(err, roche.ErrInvalidConfig) && err != nil {
				t.Fatalf("config error %v does not wrap ErrInvalidConfig", err)
			}
			out, _ := json.Marshal(fc)
			if err := os.WriteFile(p, out, 0o600); err != nil {
				t.Fatal(err)
			}
			if again, err := LoadFileConfig(p); err != nil || !reflect.DeepEqual(again, fc) {
				t.Fatalf("config %+v written as %s loads as %+v (%v)", fc, out, again, err)
			}
		} else if !errors.Is(err, roche.ErrInvalidConfig) {
			t.Fatalf("config error %v does not wrap ErrInvalidConfig", err)
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		tenants, err := LoadTokensFile(p)
		if err != nil {
			if !errors.Is(err, roche.ErrInvalidConfig) {
				t.Fatalf("tokens file error %v does not wrap ErrInvalidConfig", err)
			}
			return
		}
		if !oneObject() || len(tenants) == 0 {
			t.Fatalf("tokens file %q loaded %d tenants, and is not one JSON object listing some", b, len(tenants))
		}
		if (Config{Tenants: tenants}).Validate([]string{"mem"}) == nil {
			seen := map[string]bool{}
			for _, tn := range tenants {
				if !validTenantName(tn.Name) || tn.Name == LocalTenant || seen[tn.Name] || len(tn.TokenSHA256) != 64 || tn.MaxSandboxes < 0 {
					t.Fatalf("tenant %+v passed the checks", tn)
				}
				seen[tn.Name] = true
			}
		}
	})
}
