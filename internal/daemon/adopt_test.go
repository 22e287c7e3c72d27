package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/cli"
	"github.com/roche-sandbox/roche/internal/cli/full"
	"github.com/roche-sandbox/roche/pool"
	"github.com/roche-sandbox/roche/provider/kit"
)

// TestAdoptsOnlyItsOwn: on an engine holding a direct-mode CLI user's sandbox and
// another daemon's (one handed to its client, one idle in its pool), a fresh daemon on a
// state file of its own neither lists, serves, counts nor reaps any of them, at start-up
// or at its reconciles; each stays alive for its owner.
func TestAdoptsOnlyItsOwn(t *testing.T) {
	ctx := ctxFor(t, 3*time.Minute)
	rec := newRecorder(t)
	t.Cleanup(func() { rec.Close() }) // after the cleanups below, which use it

	var out, errb bytes.Buffer
	if code := cli.Main([]string{"create", "--direct", "--image", testImage(), "--timeout", "300"}, strings.NewReader(""), &out, &errb, full.Local{}); code != 0 {
		t.Fatalf("roche create --direct: exit %d: %s", code, errb.String())
	}
	cliID := strings.TrimSpace(out.String())
	t.Cleanup(func() { rec.Provider.Destroy(context.Background(), cliID) })
	if info, err := rec.Inspect(ctx, cliID); err != nil || !strings.HasPrefix(info.Owner, "cli:") {
		t.Fatalf("the CLI's sandbox: owner %q (%v), want cli:USER@HOST", info.Owner, err)
	}

	spec, err := pool.ParseSpec("docker/" + testImage() + "?min=1&max=1")
	if err != nil {
		t.Fatal(err)
	}
	other := startDaemon(t, Config{Pools: []pool.Spec{spec}})
	held, err := other.p.Create(ctx, pyConfig())
	if err != nil {
		t.Fatal(err)
	}
	var otherIdle string
	eventually(t, time.Minute, "the other daemon's pool to fill", func() bool {
		ids := other.d.ledger.Pools()[0].IdleIDs()
		if len(ids) == 1 {
			otherIdle = ids[0]
		}
		return otherIdle != ""
	})
	theirs := []string{cliID, held.ID, otherIdle}

	fresh := startDaemon(t, Config{ReconcileInterval: 100 * time.Millisecond})
	// Several reconciles: the one at start and three more (each lists the provider, and
	// nothing else does before the List below).
	eventually(t, time.Minute, "the fresh daemon to reconcile four times", func() bool { return fresh.rec.lists.Load() >= 4 })
	list, err := fresh.p.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range theirs {
		if _, ok := fresh.d.ledger.Tracked(id); ok {
			t.Errorf("the fresh daemon tracks %s, which is not its own", id)
		}
	}
	for _, id := range theirs {
		if slices.Contains(ids(list), id) {
			t.Errorf("the fresh daemon lists %s", id)
		}
		if _, err := fresh.p.Inspect(ctx, id); connectCode(err) != connect.CodeNotFound {
			t.Errorf("the fresh daemon inspecting %s: %v, want NOT_FOUND", id, err)
		}
		if _, err := fresh.c.DestroyAll(ctx, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := rec.Provider.Inspect(ctx, id); err != nil {
			t.Errorf("sandbox %s (of %v) did not survive the fresh daemon: %v", id, theirs, err)
		}
	}
	var state struct{ Instance string }
	if b, err := os.ReadFile(fresh.d.cfg.StateFile); err != nil || json.Unmarshal(b, &state) != nil || state.Instance == "" {
		t.Errorf("the fresh daemon's state file has no instance: %v", err)
	}
	if !strings.Contains(fresh.d.ledger.Owner(), state.Instance) || fresh.d.ledger.Owner() == other.d.ledger.Owner() {
		t.Errorf("two daemons on two state files share an owner: %s", fresh.d.ledger.Owner())
	}
	other.p.Destroy(ctx, held.ID)
}

// TestAdoptsItsOwnAndItsOrphans kills roched (kill -9) right after a sandbox was made
// whose record never reached the state file: the next roched on the same state file is
// the same owner, keeps the recorded one and destroys the other, a create the crash cut
// short whose client was told it failed. Killed again and with its state file gone, the
// next roched is a new instance; the recorded sandbox, made by a daemon on this very
// state file, is an orphan it adopts and serves. It destroys it at the end.
func TestAdoptsItsOwnAndItsOrphans(t *testing.T) {
	dir := shortDir(t)
	socket := filepath.Join(dir, "roched.sock")
	state := filepath.Join(dir, "roched.state.json")
	ctx := ctxFor(t, 3*time.Minute)
	rec := newRecorder(t)
	t.Cleanup(func() { rec.Close() }) // after the cleanups below, which use it

	first := startRochedEnv(t, socket, nil)
	c, err := client.New(client.WithSocket(socket))
	if err != nil {
		t.Fatal(err)
	}
	recorded, err := c.Provider("docker").Create(ctx, pyConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rec.Provider.Destroy(context.Background(), recorded.ID) })
	c.Close()
	var sf struct{ Instance string }
	b, _ := os.ReadFile(state)
	if err := json.Unmarshal(b, &sf); err != nil || sf.Instance == "" {
		t.Fatalf("state file %s: %v", b, err)
	}
	// As if the daemon had crashed between the engine's create and its state file: the
	// owner it gives the local tenant's sandboxes (the ledger's owner.go), its instance
	// being the state file's.
	info, err := rec.Provider.Inspect(ctx, recorded.ID)
	if err != nil || !strings.HasPrefix(info.Owner, "roched:"+sf.Instance+".") || !strings.HasSuffix(info.Owner, "/"+LocalTenant) {
		t.Fatalf("the recorded sandbox's owner %q (%v) is not the instance %s's for tenant %s", info.Owner, err, sf.Instance, LocalTenant)
	}
	unrecorded, err := kit.Create(ctx, rec.Provider, pyConfig(), kit.CreateOptions{Owner: info.Owner})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rec.Provider.Destroy(context.Background(), unrecorded.ID) })
	kill9 := func(r *roched) {
		r.cmd.Process.Signal(syscall.SIGKILL)
		r.cmd.Wait()
	}
	kill9(first)

	mine := []string{recorded.ID}
	served := func(what string) {
		t.Helper()
		c, err := client.New(client.WithSocket(socket))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		list, err := c.Provider("docker").List(ctx)
		got := ids(list)
		slices.Sort(got)
		if err != nil || !slices.Equal(got, mine) {
			t.Fatalf("%s: lists %v (%v), want %v", what, got, err, mine)
		}
		for _, id := range mine {
			if res, err := c.Provider("docker").Exec(ctx, id, roche.ExecRequest{Cmd: []string{"true"}}); err != nil || res.ExitCode != 0 {
				t.Fatalf("%s: exec in %s: %+v %v", what, id, res, err)
			}
		}
	}
	second := startRochedEnv(t, socket, nil)
	served("restarted on the same state file")
	// Its own sandbox without a record is a create the crash cut short, whose client
	// heard it failed: destroyed, not adopted.
	if !strings.Contains(second.log.String(), "cut_short_destroyed=1") || strings.Contains(second.log.String(), "adopted=1") {
		t.Errorf("the restarted daemon does not report destroying the unrecorded sandbox:\n%s", second.log)
	}
	eventually(t, time.Minute, "the unrecorded sandbox to be destroyed", func() bool {
		_, err := rec.Provider.Inspect(ctx, unrecorded.ID)
		return errors.Is(err, roche.ErrNotFound)
	})
	kill9(second)

	if err := os.Remove(state); err != nil {
		t.Fatal(err)
	}
	third := startRochedEnv(t, socket, nil)
	served("restarted with the state file gone")
	if !strings.Contains(third.log.String(), "adopted=1") {
		t.Errorf("the new instance does not report adopting the orphan:\n%s", third.log)
	}
	c, err = client.New(client.WithSocket(socket))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, id := range mine {
		if err := c.Provider("docker").Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	stopRoched(t, third)
	for _, id := range mine {
		if _, err := rec.Provider.Inspect(ctx, id); err == nil {
			t.Errorf("sandbox %s survived the daemon that adopted it", id)
		}
	}
}
