package kit_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

// plain is a provider that knows nothing of CreateOptions.
type plain struct {
	roche.Provider
	created int
}

func (p *plain) Name() string { return "plain" }
func (p *plain) Create(context.Context, roche.Config) (roche.SandboxInfo, error) {
	p.created++
	return roche.SandboxInfo{ID: "p"}, nil
}

// creator is one that does.
type creator struct {
	plain
	got kit.CreateOptions
}

func (c *creator) CreateFor(_ context.Context, _ roche.Config, opts kit.CreateOptions) (roche.SandboxInfo, error) {
	c.got = opts
	return roche.SandboxInfo{ID: "c", Owner: opts.Owner}, nil
}

// TestCreate: options reach a Creator whole; a provider that cannot take them refuses
// them rather than making a sandbox without its owner or lease, and still creates when
// there are none.
func TestCreate(t *testing.T) {
	ctx, cfg := context.Background(), roche.DefaultConfig()
	opts := kit.CreateOptions{Owner: "roched:x/t", Leased: true}
	c := &creator{}
	if info, err := kit.Create(ctx, c, cfg, opts); err != nil || c.got != opts || info.Owner != opts.Owner || c.created != 0 {
		t.Fatalf("through a Creator: %+v %v, options %+v, plain creates %d", info, err, c.got, c.created)
	}
	p := &plain{}
	if _, err := kit.Create(ctx, p, cfg, kit.CreateOptions{Owner: "cli:a@b"}); !errors.Is(err, roche.ErrUnsupported) || !strings.Contains(err.Error(), "plain") || p.created != 0 {
		t.Fatalf("an owner for a provider without CreateFor: %v (created %d), want ErrUnsupported and nothing made", err, p.created)
	}
	if _, err := kit.Create(ctx, p, cfg, kit.CreateOptions{Leased: true}); !errors.Is(err, roche.ErrUnsupported) || p.created != 0 {
		t.Fatalf("a lease from a provider without CreateFor: %v (created %d)", err, p.created)
	}
	if info, err := kit.Create(ctx, p, cfg, kit.CreateOptions{}); err != nil || info.ID != "p" || p.created != 1 {
		t.Fatalf("no options: %+v %v (created %d)", info, err, p.created)
	}
}

// TestSpecJSON: a Spec is written as providers' records always held a config (its
// fields with owner and leased among them), and records written so read back whole.
func TestSpecJSON(t *testing.T) {
	cfg := roche.DefaultConfig()
	cfg.Workspace = "w"
	s := kit.Spec{Config: cfg, CreateOptions: kit.CreateOptions{Owner: "roched:i.k/local", Leased: true}}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var flat map[string]any
	if err := json.Unmarshal(b, &flat); err != nil {
		t.Fatal(err)
	}
	if flat["owner"] != "roched:i.k/local" || flat["leased"] != true || flat["image"] != cfg.Image || flat["workspace"] != "w" {
		t.Fatalf("a spec's JSON: %s", b)
	}
	old := `{"image":"python:3.12-slim","memory":"512m","owner":"cli:ada@host","leased":true,"timeout_secs":60}`
	var back kit.Spec
	if err := json.Unmarshal([]byte(old), &back); err != nil || back.Owner != "cli:ada@host" || !back.Leased || back.TimeoutSecs != 60 || back.Memory != "512m" {
		t.Fatalf("a record with the owner in its config reads as %+v (%v)", back, err)
	}
	var again kit.Spec
	if err := json.Unmarshal(b, &again); err != nil || !reflect.DeepEqual(again, s) {
		t.Fatalf("%+v comes back as %+v (%v)", s, again, err)
	}
}
