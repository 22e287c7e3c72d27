package daemon

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/internal/wire"
)

// TestMainBadInput: every bad input is one line on stderr, exit 1, no panic, and no
// daemon started.
func TestMainBadInput(t *testing.T) {
	dir := shortDir(t)
	badJSON := filepath.Join(dir, "bad.json")
	os.WriteFile(badJSON, []byte(`{"pools": ["docker/img"], "max_sandbox": 3}`), 0o600)
	sock := filepath.Join(dir, "s.sock")
	good := filepath.Join(dir, "good.token")
	os.WriteFile(good, []byte("0123456789abcdef0123456789abcdef\n"), 0o600)
	open := filepath.Join(dir, "open.token")
	os.WriteFile(open, []byte("0123456789abcdef0123456789abcdef"), 0o600)
	os.Chmod(open, 0o644)
	short := filepath.Join(dir, "short.token")
	os.WriteFile(short, []byte("s3cret"), 0o600)
	tokens := filepath.Join(dir, "tokens.json")
	os.WriteFile(tokens, []byte(`{"tenants": [{"name": "Acme", "token_sha256": "abc"}, {"name": "local", "token_sha256": "`+HashToken("x")+`"}]}`), 0o600)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "unknown flag: --bogus (see roched --help)"},
		{[]string{"--socket", sock, "--pool", "docker"}, "use PROVIDER/IMAGE"},
		{[]string{"--socket", sock, "--pool", "docker/img?min=3&max=1&size=2"}, `max (1) is below min (3)`},
		{[]string{"--socket", sock, "--pool", "vm/img"}, `unknown provider "vm"`},
		{[]string{"--socket", sock, "--listen", "tcp://127.0.0.1:0"}, "without a token"},
		{[]string{"--socket", sock, "--listen", "127.0.0.1:80", "--token-file", good}, "use tcp://HOST:PORT"},
		{[]string{"--socket", sock, "--listen", "tcp://127.0.0.1:0", "--token", "0123456789abcdef0123"}, "pass --token-file FILE"},
		{[]string{"--socket", sock, "--listen", "tcp://127.0.0.1:0", "--token-file", open}, "open to group or others (mode 0644): anyone who can read it can run code; chmod 600"},
		{[]string{"--socket", sock, "--listen", "tcp://127.0.0.1:0", "--token-file", short}, "has 6 characters: use at least 16"},
		{[]string{"--socket", sock, "--listen", "tcp://127.0.0.1:0", "--tokens-file", tokens}, `tenant name "Acme"`},
		{[]string{"--socket", sock, "--listen", "tcp://127.0.0.1:0", "--tokens-file", tokens}, `"local" is the unix socket's`},
		{[]string{"--socket", sock, "--allow-mount-root", "relative/dir"}, "is not an absolute path"},
		{[]string{"--socket", sock, "--config", filepath.Join(dir, "none.json")}, "reading config"},
		{[]string{"--socket", sock, "--config", badJSON}, `unknown field "max_sandbox"`},
		{[]string{"--socket", sock, "--log-format", "xml"}, "use text or json"},
		{[]string{"--socket", sock, "--max-sandboxes", "-1"}, "negative"},
		{[]string{"--socket", sock, "--pool-concurrency", "-1"}, "--pool-concurrency -1: give 1 or more, or 0 to let it adapt"},
		{[]string{"--socket", sock, "--providers", "dokcer"}, `--providers: invalid config: unknown provider "dokcer"`},
		{[]string{"--socket", sock, "--providers", "wasm", "--pool", "docker/img"}, `unknown provider "docker"`},
		{[]string{"--socket", sock, "--copy-max-bytes", "lots"}, `--copy-max-bytes: invalid config: "lots" is not a size`},
		{[]string{"--socket", sock, "--copy-max-bytes", "0"}, "--copy-max-bytes: invalid config: 0 copies nothing"},
		{[]string{"extra"}, "unknown command"},
	}
	for _, c := range cases {
		var out, errb bytes.Buffer
		code := Main(c.args, &out, &errb)
		msg := errb.String()
		if code != 1 || strings.Count(msg, "\n") != 1 || !strings.HasPrefix(msg, "roched: ") || !strings.Contains(msg, c.want) {
			t.Errorf("roched %v: exit %d, stderr %q; want one line saying %q", c.args, code, msg, c.want)
		}
	}
	if _, err := os.Stat(sock); err == nil {
		t.Error("a refused start left a socket")
	}
}

func TestMainHelp(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main([]string{"--help"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "Example") ||
		!strings.Contains(out.String(), "docker/roche/python:local?min=2&max=5&total=20&idle_timeout=600") {
		t.Fatalf("--help: exit %d\n%s%s", code, out.String(), errb.String())
	}
}

// TestConfigFileAndFlags: the file gives settings, flags win, a --pool replaces the
// file's pool for the same provider/image.
// TestMainVersion: roched --version says which build it is, on one line.
func TestMainVersion(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main([]string{"--version"}, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "roched ") ||
		strings.Count(out.String(), "\n") != 1 || errb.Len() != 0 {
		t.Fatalf("roched --version: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
}

func TestConfigFileAndFlags(t *testing.T) {
	dir := shortDir(t)
	file := filepath.Join(dir, "roched.json")
	os.WriteFile(file, []byte(`{
  "socket": "/from/file.sock",
  "max_sandboxes": 7,
  "pool_concurrency": 3,
  "pools": ["docker/a?min=1", "docker/b?min=2&max=4"],
  "copy_max_bytes": "1.5 GiB"
}`), 0o600)
	var f flags
	cmd := command(&f, io.Discard)
	if err := cmd.ParseFlags([]string{"--config", file, "--max-sandboxes", "9", "--pool", "docker/b?min=3&max=3"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := buildConfig(cmd, &f)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Socket != "/from/file.sock" || cfg.MaxSandboxes != 9 || cfg.PoolConcurrency != 3 || cfg.CopyMaxBytes != 3<<29 {
		t.Fatalf("merged config %+v", cfg)
	}
	if len(cfg.Pools) != 2 || cfg.Pools[0].Image != "a" || cfg.Pools[1].Image != "b" || cfg.Pools[1].MinIdle != 3 {
		t.Fatalf("pools %+v", cfg.Pools)
	}
}

// TestRPCErrorMapping: each core sentinel maps to its RPC code with the message kept.
func TestRPCErrorMapping(t *testing.T) {
	cases := []struct {
		err  error
		code connect.Code
	}{
		{roche.ErrNotFound, connect.CodeNotFound},
		{roche.ErrInvalidConfig, connect.CodeInvalidArgument},
		{roche.ErrUnavailable, connect.CodeUnavailable},
		{roche.ErrTimeout, connect.CodeDeadlineExceeded},
		{roche.ErrUnsupported, connect.CodeUnimplemented},
		{roche.ErrImageNotFound, connect.CodeFailedPrecondition},
		{roche.ErrExhausted, connect.CodeResourceExhausted},
		{roche.ErrPermission, connect.CodePermissionDenied},
		{errors.New("engine exploded"), connect.CodeInternal},
	}
	for _, c := range cases {
		wrapped := &wrap{msg: "starting sandbox x: " + c.err.Error(), err: c.err}
		got := wire.ToStatus(wrapped)
		var ce *connect.Error
		if !errors.As(got, &ce) || ce.Code() != c.code || ce.Message() != wrapped.Error() {
			t.Errorf("%v -> %v, want code %v with the message kept", wrapped, got, c.code)
			continue
		}
		if c.code == connect.CodeInternal {
			continue
		}
		if len(ce.Details()) != 1 {
			t.Errorf("%v: no ErrorDetail", c.err)
			continue
		}
		v, _ := ce.Details()[0].Value()
		if _, ok := v.(*rochev1.ErrorDetail); !ok {
			t.Errorf("%v: detail %T", c.err, v)
		}
	}
}

type wrap struct {
	msg string
	err error
}

func (w *wrap) Error() string { return w.msg }
func (w *wrap) Unwrap() error { return w.err }
