// Command hello runs python3 in a Docker sandbox from Go: the README's Go quick start.
// roche-agent, which every Docker sandbox runs, is found beside the program, on PATH (go
// install, make build's bin/), or where ROCHE_AGENT says.
package main

import (
	"context"
	"fmt"
	"log"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/docker"
)

func main() {
	if err := run(context.Background()); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context) error {
	p, err := docker.New()
	if err != nil {
		return err
	}
	defer p.Close()
	cfg := roche.DefaultConfig() // no network, read-only root, 512 MiB, 1 CPU, 300 s, ...
	cfg.Image = "roche/python:local"
	sb, err := p.Create(ctx, cfg)
	if err != nil {
		return err
	}
	defer p.Destroy(context.WithoutCancel(ctx), sb.ID)
	res, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "print('hello')"}})
	if err != nil {
		return err
	}
	fmt.Print(res.Stdout) // res.ExitCode, res.Stderr, res.TimedOut, res.Truncated, res.OOMKilled
	return nil
}
