package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/roche-sandbox/roche"
)

// holdCheckEvery is how often create --hold looks whether its sandbox still exists, so
// that a sandbox destroyed elsewhere or at the end of its lifetime does not leave the
// process behind until its standard input closes.
const holdCheckEvery = 10 * time.Second

// holdSandbox serves create --hold once the sandbox is made: it prints the sandbox as one
// line, then keeps it, and through the provider its lease, until standard input ends (or
// a signal), and destroys it then. Lines read meanwhile are requests (holdRequest).
func (e *env) holdSandbox(ctx context.Context, p roche.Provider, info roche.SandboxInfo, asJSON bool) error {
	id := info.ID
	if err := e.printHeld(info, asJSON); err != nil {
		e.destroyQuietly(ctx, p, id)
		return fmt.Errorf("printing sandbox %s: %w", id, err)
	}
	lines := make(chan string)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(e.stdin)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-stop:
				return
			}
		}
	}()
	check := time.NewTicker(holdCheckEvery)
	defer check.Stop()
	for {
		select {
		case <-ctx.Done():
			e.destroyQuietly(ctx, p, id)
			return ctx.Err()
		case <-check.C:
			if _, err := p.Inspect(ctx, id); errors.Is(err, roche.ErrNotFound) {
				return nil // destroyed elsewhere, or its lifetime ended: nothing left to hold
			}
		case line, ok := <-lines:
			if !ok {
				return e.destroyHeld(ctx, p, id)
			}
			id = e.holdRequest(ctx, p, id, line, asJSON)
		}
	}
}

// destroyHeld destroys the sandbox create --hold kept, once its standard input closed,
// within the bound roche run has for its own.
func (e *env) destroyHeld(ctx context.Context, p roche.Provider, id string) error {
	dctx, cancel := context.WithTimeout(ctx, destroyTimeout)
	defer cancel()
	if err := p.Destroy(dctx, id); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("destroying sandbox %s: %w (roche destroy %s removes it; its lifetime ends it anyway)", id, err, id)
	}
	return nil
}

// holdRequest serves one line sent to create --hold and returns the id it holds next.
// "reset" is served here rather than by roche reset so that the new sandbox is leased to
// this process too: made by another roche, its lease would end with that process.
func (e *env) holdRequest(ctx context.Context, p roche.Provider, id, line string, asJSON bool) string {
	keep := true
	switch strings.TrimSpace(line) {
	case "":
		return id
	case "reset":
	case "reset --wipe-workspace":
		keep = false
	default:
		fmt.Fprintf(e.stdout, "roche: unknown request %q: send reset or reset --wipe-workspace, or close standard input to destroy sandbox %s\n", line, id)
		return id
	}
	r, ok := p.(roche.Resetter)
	if !ok {
		fmt.Fprintf(e.stdout, "roche: %s\n", oneLine(fmt.Errorf("%w: the %s provider cannot reset sandboxes", roche.ErrUnsupported, p.Name())))
		return id
	}
	info, err := r.Reset(ctx, id, keep)
	if err != nil {
		fmt.Fprintf(e.stdout, "roche: %s\n", oneLine(err))
		return id
	}
	if err := e.printHeld(info, asJSON); err != nil {
		// Nobody reads any more: the caller is gone, so is the sandbox's reason to be.
		e.destroyQuietly(ctx, p, info.ID)
	}
	return info.ID
}

// printHeld prints a held sandbox as one line: its id, or with --json the object.
func (e *env) printHeld(info roche.SandboxInfo, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(e.stdout).Encode(info)
	}
	_, err := fmt.Fprintln(e.stdout, info.ID)
	return err
}
