package docker

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestUndoOfAContainerGoneAlready: undoing a create whose container the engine made and
// has removed already (its auto-remove, when the agent exited at once, can finish
// before the undo) is done at once, without a warning or a removal in the background.
// A container that is only named (a create cut short, which the engine may still make)
// and not there is looked for again in the background, as before.
func TestUndoOfAContainerGoneAlready(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	var logs testenv.SyncBuffer
	p, err := New(WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := p.cli.ContainerCreate(ctx, &container.Config{
		Image: testenv.Image(), Cmd: []string{"true"}, Labels: map[string]string{"roche.test": "undo"},
	}, &container.HostConfig{NetworkMode: "none"}, nil, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cli.ContainerRemove(ctx, resp.ID, removeOpts); err != nil {
		t.Fatal(err)
	}
	background := func() bool {
		done := make(chan struct{})
		go func() { p.halfMade.Wait(); close(done) }()
		select {
		case <-done:
			return false
		case <-time.After(time.Second):
			return true
		}
	}

	p.undo(resp.ID, "", true, nil)
	if background() || strings.Contains(logs.String(), "will retry") {
		t.Errorf("undoing a made container the engine removed already went to the background: %s", logs.String())
	}

	name := "roche-test-undo-" + resp.ID[:12]
	p.undo(name, "", false, nil)
	if !background() || !strings.Contains(logs.String(), "will retry in the background") {
		t.Errorf("undoing a named container that is not there (yet) did not look again in the background: %s", logs.String())
	}
	// It gives up after a few "no such container" answers.
	done := make(chan struct{})
	go func() { p.halfMade.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Duration(halfMadeGone+2) * halfMadeRetry):
		t.Errorf("the background removal of a container never made still runs after %d answers", halfMadeGone)
	}
}
