package providertest

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

// testMetadata: metadata given at create comes back from Create, List and Inspect, as the
// provider stored it, List filters select on it, and no key can stand for one of Roche's
// own labels (the owner here): such a create is refused and makes nothing, and a key that
// merely looks like one ("owner") leaves the real owner as it was.
func (s *suite) testMetadata(t *testing.T) {
	cfg := s.opts.Config
	cfg.TimeoutSecs = 300
	run := fmt.Sprintf("%d-%d", os.Getpid(), time.Now().UnixNano())
	cfg.Metadata = map[string]string{"run": run, "owner": "mallory", "note": "héllo, wörld = 1"}
	opts := kit.CreateOptions{Owner: "providertest:" + run}
	wantOwner := s.opts.Owner
	if wantOwner == "" {
		wantOwner = opts.Owner
	}
	id := s.createFor(t, cfg, opts)
	got, err := s.p.Inspect(ctxFor(t, time.Minute), id)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if !maps.Equal(got.Metadata, cfg.Metadata) {
		t.Errorf("Inspect: metadata %v, want %v", got.Metadata, cfg.Metadata)
	}
	if got.Owner != wantOwner {
		t.Errorf("Inspect: owner %q with metadata owner=mallory, want %q", got.Owner, wantOwner)
	}
	list, err := s.p.List(ctxFor(t, time.Minute))
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	match := roche.ListFilter{Metadata: map[string]string{"run": run}, State: roche.StateRunning}.Filter(list)
	if len(match) != 1 || match[0].ID != id || !maps.Equal(match[0].Metadata, cfg.Metadata) || match[0].Owner != wantOwner {
		t.Errorf("List filtered on run=%s: %+v, want only %s with its metadata and owner %q", run, match, id, wantOwner)
	}
	if n := len(roche.ListFilter{Metadata: map[string]string{"run": run, "note": "other"}}.Filter(list)); n != 0 {
		t.Errorf("List filtered on a pair it lacks kept %d sandboxes", n)
	}

	// The attack: metadata naming Roche's own labels, to pass for another owner's sandbox
	// or an unmanaged one. Refused before anything is made.
	for _, key := range []string{"roche.owner", "roche.managed", "ROCHE.expires", "roche", "a/roche.owner", "x=y"} {
		bad := s.opts.Config
		bad.Metadata = map[string]string{key: "spoofed"}
		info, err := s.p.Create(ctxFor(t, time.Minute), bad)
		if err == nil {
			s.mu.Lock()
			s.created = append(s.created, info.ID)
			s.mu.Unlock()
			_ = s.p.Destroy(ctxFor(t, time.Minute), info.ID)
			t.Errorf("Create with metadata key %q succeeded (%s): Roche's own labels must not be settable", key, info.ID)
			continue
		}
		if !errors.Is(err, roche.ErrInvalidConfig) || strings.Contains(err.Error(), "\n") {
			t.Errorf("Create with metadata key %q: %v, want one line of ErrInvalidConfig", key, err)
		}
	}
}

// testSetTimeout: a lifetime moved from now is what the provider reports and what ends
// the sandbox, sooner (it ends within seconds) or later (it lives past its old end).
func (s *suite) testSetTimeout(t *testing.T) {
	ls := s.p.(roche.LifetimeSetter)
	cfg := s.opts.Config
	run := fmt.Sprintf("providertest-lifetime:%d-%d", os.Getpid(), time.Now().UnixNano())
	opts := kit.CreateOptions{Owner: run}

	// Later: a sandbox made to live 10 s is given 90 s at once, and lives on past its old end.
	// A microVM lives 30 s: under TCG emulation on a loaded machine its boot alone took
	// more than 10 s, and it ended before the call that was to extend it.
	oldEnd := 10 * time.Second
	if s.opts.VM {
		oldEnd = 30 * time.Second
	}
	cfg.TimeoutSecs = int(oldEnd / time.Second)
	long := s.createFor(t, cfg, opts)
	longMade := time.Now()
	extended, err := ls.SetTimeout(ctxFor(t, time.Minute), long, 90*time.Second)
	switch {
	case errors.Is(err, roche.ErrUnsupported):
		t.Logf("%s refuses: %v", s.p.Name(), err)
		extended = roche.SandboxInfo{}
	case err != nil:
		t.Fatalf("SetTimeout(90s) of a sandbox made to live %s: %v", oldEnd, err)
	case extended.ExpiresAt.Before(time.Now().Add(80 * time.Second)):
		t.Errorf("SetTimeout(90s): expires at %v, want about 90 s from now", extended.ExpiresAt)
	}

	// Sooner: one made to live 10 minutes ends 3 s from now.
	cfg.TimeoutSecs = 600
	short := s.createFor(t, cfg, opts)
	for _, d := range []time.Duration{0, 500 * time.Millisecond, (roche.MaxTimeoutSecs + 1) * time.Second} {
		if _, err := ls.SetTimeout(ctxFor(t, time.Minute), short, d); !errors.Is(err, roche.ErrInvalidConfig) {
			t.Errorf("SetTimeout(%s): %v, want ErrInvalidConfig", d, err)
		}
	}
	asked := time.Now()
	info, err := ls.SetTimeout(ctxFor(t, time.Minute), short, 3*time.Second)
	if errors.Is(err, roche.ErrUnsupported) {
		t.Logf("%s refuses: %v", s.p.Name(), err)
		return
	}
	if err != nil {
		t.Fatalf("SetTimeout(3s): %v", err)
	}
	if d := info.ExpiresAt.Sub(asked); d < 2*time.Second || d > 5*time.Second {
		t.Errorf("SetTimeout(3s): expires %s after the call, want about 3 s", d)
	}
	if got, err := s.p.Inspect(ctxFor(t, time.Minute), short); err != nil || got.ExpiresAt.Sub(info.ExpiresAt).Abs() > time.Second {
		t.Errorf("Inspect after SetTimeout: expires %v (%v), want %v", got.ExpiresAt, err, info.ExpiresAt)
	}

	// The shortened one ends by itself where something in the sandbox keeps its
	// lifetime (roche-agent); a wasm sandbox runs nothing between execs, and its end is
	// what roche gc and roched's reaper collect it at.
	ended := false
	for until := time.Now().Add(60 * time.Second); time.Now().Before(until); time.Sleep(250 * time.Millisecond) {
		got, err := s.p.Inspect(ctxFor(t, time.Minute), short)
		if errors.Is(err, roche.ErrNotFound) || err == nil && got.State == roche.StateExited {
			ended = true
			break
		}
		if err == nil && !s.caps.Processes && got.Expired(time.Now()) {
			if gc, ok := s.p.(roche.GarbageCollector); ok {
				removed, err := gc.GC(ctxFor(t, time.Minute), roche.GCOptions{Owner: got.Owner})
				if err != nil {
					t.Fatalf("GC: %v", err)
				}
				for _, r := range removed {
					ended = ended || r.ID == short
				}
				if ended {
					break
				}
			}
		}
	}
	if !ended {
		t.Errorf("sandbox %s still runs 60 s after SetTimeout(3s)", short)
	} else if el := time.Since(asked); el < 2*time.Second {
		t.Errorf("sandbox %s ended %s after SetTimeout(3s), before its new end", short, el)
	}

	if extended.ID == "" {
		return
	}
	// Past the old end (after the create), and past any backstop a provider keeps beyond
	// it (a VM's supervisor stops it 10 s after its end), with margin.
	time.Sleep(time.Until(longMade.Add(oldEnd + 13*time.Second)))
	res, err := s.p.Exec(ctxFor(t, time.Minute), long, roche.ExecRequest{Cmd: append(append([]string{}, s.opts.Python...), "-c", "print('alive')"), Timeout: 30 * time.Second})
	if err != nil || strings.TrimSpace(res.Stdout) != "alive" {
		t.Errorf("a sandbox given 90 s more, 13 s past its old end: %q, %v; want it alive", res.Stdout, err)
	}
	if gc, ok := s.p.(roche.GarbageCollector); ok {
		removed, err := gc.GC(ctxFor(t, time.Minute), roche.GCOptions{Owner: extended.Owner})
		if err != nil {
			t.Fatalf("GC: %v", err)
		}
		for _, r := range removed {
			if r.ID == long {
				t.Errorf("GC removed %s, whose lifetime was extended, as expired", long)
			}
		}
	}
}
