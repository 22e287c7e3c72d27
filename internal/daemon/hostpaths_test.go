package daemon

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/api/roche/v1/rochev1connect"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/internal/wire"
	"github.com/roche-sandbox/roche/provider/oci"
)

// rochedBinary is the real roched binary, built from this checkout, serving a unix
// socket and TCP on a loopback port of its choosing.
type rochedBinary struct {
	cmd    *exec.Cmd
	log    *syncBuffer
	socket string
	addr   string // http://127.0.0.1:PORT
	done   chan struct{}
}

// startRochedBinary builds and starts roched with env (the whole environment) and args,
// and waits for its "roched listening" line, which names the TCP address.
func startRochedBinary(t *testing.T, env []string, args ...string) *rochedBinary {
	t.Helper()
	_, bin, err := testenv.BuildCLI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir := shortDir(t)
	r := &rochedBinary{log: &syncBuffer{}, socket: filepath.Join(dir, "r.sock"), done: make(chan struct{})}
	r.cmd = exec.Command(bin, append([]string{"--socket", r.socket, "--state", filepath.Join(dir, "state.json"),
		"--listen", "tcp://127.0.0.1:0", "--log-format", "json"}, args...)...)
	r.cmd.Env = env
	r.cmd.Stdout = r.log
	stderr, err := r.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	listening := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			r.log.Write(append(sc.Bytes(), '\n'))
			var line struct {
				Msg string `json:"msg"`
				TCP string `json:"tcp"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "roched listening" {
				listening <- line.TCP
			}
		}
		r.cmd.Wait()
		close(r.done)
	}()
	t.Cleanup(func() {
		r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.done:
		case <-time.After(time.Minute):
			r.cmd.Process.Kill()
			<-r.done
			t.Errorf("roched did not stop on SIGTERM; its log:\n%s", r.log.String())
		}
	})
	select {
	case addr := <-listening:
		r.addr = "http://" + addr
	case <-r.done:
		t.Fatalf("roched exited before listening: %s", r.log.String())
	case <-time.After(2 * time.Minute):
		t.Fatalf("roched did not say it was listening in 2 minutes: %s", r.log.String())
	}
	return r
}

// tenantRPC is a raw API client of a TCP tenant, for the codes the Go client smooths over.
func (r *rochedBinary) tenantRPC(t *testing.T, token string) rochev1connect.SandboxServiceClient {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return rochev1connect.NewSandboxServiceClient(&http.Client{Transport: bearerOn{tr, token}}, r.addr)
}

type bearerOn struct {
	rt    http.RoundTripper
	token string
}

func (b bearerOn) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.rt.RoundTrip(r)
}

// environWithout is this process's environment without the named variables.
func environWithout(names ...string) []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return slices.Contains(names, k)
	})
}

// writeTokens writes a tokens file (mode 0600) with one tenant per name and token.
func writeTokens(t *testing.T, dir string, tokens map[string]string) string {
	t.Helper()
	var tf TokensFile
	for name, tok := range tokens {
		tf.Tenants = append(tf.Tenants, Tenant{Name: name, TokenSHA256: HashToken(tok)})
	}
	b, _ := json.Marshal(tf)
	path := filepath.Join(dir, "tokens.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// writeLayout writes an OCI image layout at dir holding a one-layer image with file
// /hello.txt saying hello, its config unique to the test run (so it is unpacked here,
// not found in a cache); it returns the config's digest, hex (the cache entry's name).
func writeLayout(t *testing.T, dir, hello string) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "hello.txt", Mode: 0o644, Size: int64(len(hello)), Typeflag: tar.TypeReg})
	tw.Write([]byte(hello))
	tw.Close()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	if img, err = mutate.Config(img, v1.Config{Env: []string{"STAMP=" + randomName(t.Name())}}); err != nil {
		t.Fatal(err)
	}
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	name, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return name.Hex
}

// TestTenantHostPaths runs the real roched, without a Kubernetes cluster configured, as
// its TCP tenant acme, which may mount below one directory.
//
// Image layouts from host paths: a layout outside the tenant's root is PERMISSION_DENIED
// with the same message whether the path exists or not (roched looks at nothing outside,
// so it is no oracle), as are paths that leave the root by "..". A link below the root to
// a layout outside, and a layout below it whose blobs are a link to another's, are
// refused: roched opens the layout without following links, and reads it through an
// os.Root. A layout below the root makes a sandbox with the layout's file.
//
// The unconfigured kubernetes provider is not served, so acme's List, destroy-all and
// gc-all answer with the other providers' sandboxes instead of UNAVAILABLE, and roched's
// log says it left kubernetes out.
func TestTenantHostPaths(t *testing.T) {
	testenv.Needs(t, testenv.Root, testenv.Docker) // roched's oci provider
	base := shortDir(t)
	root := filepath.Join(base, "allowed")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{root, outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	good := filepath.Join(root, "layout")
	goodID := writeLayout(t, good, "inside the root\n")
	victim := filepath.Join(outside, "layout")
	victimID := writeLayout(t, victim, "the victim's\n")
	t.Cleanup(func() {
		// The cache entries of this test's images are of no use to anyone else.
		for _, id := range []string{goodID, victimID} {
			os.RemoveAll(filepath.Join("/var/lib/roche/oci/images", id))
		}
	})
	os.Symlink(victim, filepath.Join(root, "link"))
	// A layout of its own below the root, whose blobs are the victim's, through a link.
	borrowed := filepath.Join(root, "borrowed")
	os.Mkdir(borrowed, 0o755)
	for _, f := range []string{"index.json", "oci-layout"} {
		b, _ := os.ReadFile(filepath.Join(victim, f))
		os.WriteFile(filepath.Join(borrowed, f), b, 0o644)
	}
	os.Symlink(filepath.Join(victim, "blobs"), filepath.Join(borrowed, "blobs"))

	token := randomToken()
	r := startRochedBinary(t, environWithout("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "ROCHE_TOKEN"),
		"--tokens-file", writeTokens(t, base, map[string]string{"acme": token}), "--allow-mount-root", root)
	acme := r.tenantRPC(t, token)
	ctx := ctxFor(t, 5*time.Minute)
	create := func(provider, image string) (*rochev1.CreateResponse, error) {
		cfg := pyConfig()
		cfg.Image = image
		resp, err := acme.Create(ctx, connect.NewRequest(&rochev1.CreateRequest{Provider: provider, Config: wire.ConfigToProto(cfg, false)}))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}

	t.Run("layouts", func(t *testing.T) {
		missing := filepath.Join(outside, "nothing")
		var said []string
		for _, dir := range []string{victim, missing, outside, "/etc", root + "/../outside/layout", root + "/./layout", good + "/"} {
			resp, err := create(oci.Name, oci.LayoutPrefix+dir)
			if err == nil {
				r.destroy(t, acme, resp.Sandbox.Id)
				t.Fatalf("layout %s outside acme's root made sandbox %s", dir, resp.Sandbox.Id)
			}
			msg := connect.CodeOf(err).String() + ": " + strings.ReplaceAll(err.Error(), dir, "PATH")
			if connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(msg, "is not at or below a directory tenant acme may use") {
				t.Errorf("layout %s: %v, want PERMISSION_DENIED, not at or below acme's root", dir, err)
			}
			said = append(said, msg)
		}
		if said[0] != said[1] || said[0] != said[2] {
			t.Errorf("refusals differ as the path exists or not, a layout or not (an oracle):\n%s", strings.Join(said[:3], "\n"))
		}

		for _, dir := range []string{filepath.Join(root, "link"), borrowed} {
			resp, err := create(oci.Name, oci.LayoutPrefix+dir)
			if err == nil {
				r.destroy(t, acme, resp.Sandbox.Id)
				t.Fatalf("layout %s, leading outside acme's root through a link, made sandbox %s", dir, resp.Sandbox.Id)
			}
			if connect.CodeOf(err) == connect.CodeUnavailable || connect.CodeOf(err) == connect.CodeInternal {
				t.Errorf("layout %s: %v, want a refusal of the link", dir, err)
			}
			t.Logf("layout %s: %v", dir, err)
		}

		resp, err := create(oci.Name, oci.LayoutPrefix+good)
		if err != nil {
			t.Fatalf("the layout below acme's root: %v", err)
		}
		defer r.destroy(t, acme, resp.Sandbox.Id)
		c, err := client.New(client.WithAddress(r.addr), client.WithToken(token))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		var got bytes.Buffer
		if err := c.Provider(oci.Name).ReadFile(ctx, resp.Sandbox.Id, "/hello.txt", &got); err != nil || got.String() != "inside the root\n" {
			t.Fatalf("/hello.txt of the sandbox from the layout below the root: %q %v", got.String(), err)
		}
	})

	t.Run("unconfigured provider", func(t *testing.T) {
		if !strings.Contains(r.log.String(), `"msg":"kubernetes provider not configured: serving without it"`) {
			t.Errorf("roched's log does not say it left kubernetes out:\n%s", r.log.String())
		}
		provs, err := acme.ListProviders(ctx, connect.NewRequest(&rochev1.ListProvidersRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range provs.Msg.Providers {
			if p.Name == "kubernetes" {
				t.Errorf("roched serves the kubernetes provider, which has no cluster")
			}
		}
		resp, err := create("docker", testImage())
		if err != nil {
			t.Fatal(err)
		}
		id := resp.Sandbox.Id
		list, err := acme.List(ctx, connect.NewRequest(&rochev1.ListRequest{}))
		if err != nil || len(list.Msg.Sandboxes) != 1 || list.Msg.Sandboxes[0].Id != id {
			r.destroy(t, acme, id)
			t.Fatalf("acme's list: %v %v, want its sandbox %s", list, err, id)
		}
		gc, err := acme.Gc(ctx, connect.NewRequest(&rochev1.GcRequest{All: true, DryRun: true}))
		if err != nil || len(gc.Msg.Removed) != 1 || gc.Msg.Removed[0].Id != id {
			r.destroy(t, acme, id)
			t.Fatalf("acme's gc --all --dry-run: %v %v, want its sandbox %s", gc, err, id)
		}
		all, err := acme.Destroy(ctx, connect.NewRequest(&rochev1.DestroyRequest{All: true}))
		if err != nil || !slices.Equal(all.Msg.Destroyed, []string{id}) {
			r.destroy(t, acme, id)
			t.Fatalf("acme's destroy --all: %v %v, want its sandbox %s", all, err, id)
		}
		if list, err := acme.List(ctx, connect.NewRequest(&rochev1.ListRequest{})); err != nil || len(list.Msg.Sandboxes) != 0 {
			t.Fatalf("acme's list after destroy --all: %v %v", list, err)
		}
		gc, err = acme.Gc(ctx, connect.NewRequest(&rochev1.GcRequest{All: true}))
		if err != nil || len(gc.Msg.Removed) != 0 {
			t.Fatalf("acme's gc --all with nothing left: %v %v", gc, err)
		}
	})
}

// destroy destroys a sandbox of the tenant's, failing the test if it cannot.
func (r *rochedBinary) destroy(t *testing.T, c rochev1connect.SandboxServiceClient, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.Destroy(ctx, connect.NewRequest(&rochev1.DestroyRequest{Ids: []string{id}})); err != nil && !errors.Is(err, roche.ErrNotFound) {
		t.Errorf("destroying %s: %v", id, err)
	}
}
