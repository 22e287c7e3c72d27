package client_test

import (
	"context"
	"fmt"
	"log"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
)

// An agent's state across turns: a workspace that outlives each sandbox, a reset back
// to a clean sandbox that keeps it, and a snapshot to start later sandboxes from.
func ExampleProvider_Reset() {
	ctx := context.Background()
	c, err := client.New()
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	p := c.Provider("docker")

	cfg := roche.DefaultConfig()
	cfg.Workspace = "my-agent" // mounted at /workspace, kept after destroy
	sb, err := p.Create(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"sh", "-c", "echo notes > /workspace/notes; echo scratch > /tmp/x"}}); err != nil {
		log.Fatal(err)
	}

	// Back to a clean sandbox (new id): /tmp is empty again, /workspace/notes is kept.
	sb, err = p.Reset(ctx, sb.ID, true)
	if err != nil {
		log.Fatal(err)
	}

	// Save its files; later sandboxes start from them with cfg.FromSnapshot.
	snap, err := p.Snapshot(ctx, sb.ID, "clean-env")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("saved", snap.Name)
	_ = p.Destroy(ctx, sb.ID)
}
