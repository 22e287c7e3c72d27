package kubernetes_test

import (
	"context"
	"mime"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/internal/testcluster"
	"github.com/roche-sandbox/roche/provider/kit"
	"github.com/roche-sandbox/roche/provider/kubernetes"
)

// wireTypes records the media type of each answer the API server gives, by method and
// path.
type wireTypes struct {
	mu    sync.Mutex
	types map[string]string
}

func (w *wireTypes) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		if err == nil && resp.StatusCode < 300 && resp.StatusCode != http.StatusSwitchingProtocols {
			mt, params, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
			if params["stream"] != "" {
				mt += ";stream=" + params["stream"]
			}
			key := req.Method + " " + req.URL.Path
			if req.URL.Query().Get("watch") == "true" {
				key = "WATCH " + req.URL.Path
			}
			w.mu.Lock()
			w.types[key] = mt
			w.mu.Unlock()
		}
		return resp, err
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// TestProtobufOnTheWire: the API server answers the provider in protobuf, its lists,
// watch events and answers to creates, gets, claims' patches and deletes (cheaper to
// encode there and to decode here than JSON): client-go's generated clients ask for it
// for built-in types, and every type the provider uses is one; a change to the client's
// configuration must keep it so. What has no protobuf form still works in JSON (the
// server's version, which doctor reads).
func TestProtobufOnTheWire(t *testing.T) {
	testcluster.Start(t)
	wt := &wireTypes{types: map[string]string{}}
	p := newProvider(t, kubernetes.WithTransportWrapper(wt.wrap))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	events, err := p.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	info := create(t, p, baseConfig())
	if err := p.Claim(ctx, info.ID, kit.Claim{Owner: "someone", Expires: time.Now().Add(time.Minute), Env: map[string]string{"A": "b"}}); err != nil {
		t.Fatal(err)
	}
	if c, ok, err := p.Claimed(ctx, info.ID); err != nil || !ok || c.Owner != "someone" || c.Env["A"] != "b" {
		t.Fatalf("claimed: %+v %v %v, want the claim's owner and env read back", c, ok, err)
	}
	list, err := p.List(ctx)
	if err != nil || len(list) != 1 || list[0].Owner != "someone" {
		t.Fatalf("list: %+v %v, want the one sandbox with its claim's owner", list, err)
	}
	if err := p.Destroy(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	for ev := range events {
		if ev.ID == info.ID && ev.Kind == kit.EventRemoved {
			break
		}
	}
	cancel()
	for range events {
	}
	version := ""
	for _, f := range p.Diagnose(context.Background(), "") {
		if f.Check == "cluster" && f.OK {
			version = f.Detail
		}
	}
	if !strings.HasPrefix(version, "Kubernetes v1.") {
		t.Errorf("diagnose's cluster: %q, want the server's version, read in JSON", version)
	}

	pods := "/api/v1/namespaces/" + p.Namespace() + "/pods"
	wt.mu.Lock()
	defer wt.mu.Unlock()
	for _, key := range []string{
		"GET " + pods, "WATCH " + pods, "POST " + pods, "GET " + pods + "/" + info.ID,
		"PATCH " + pods + "/" + info.ID, "DELETE " + pods + "/" + info.ID,
		"POST /apis/networking.k8s.io/v1/namespaces/" + p.Namespace() + "/networkpolicies",
	} {
		want := "application/vnd.kubernetes.protobuf"
		if strings.HasPrefix(key, "WATCH ") {
			want += ";stream=watch"
		}
		if got, ok := wt.types[key]; !ok {
			t.Errorf("%s: no answer seen", key)
		} else if got != want {
			t.Errorf("%s: answered in %s, want %s", key, got, want)
		}
	}
}
