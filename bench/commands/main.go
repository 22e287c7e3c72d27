// Command commands benchmarks durable commands: connect-and-replay of 16 MiB of a
// background command's kept output, from offset 0 to its end, against baselines taken
// in the same run on the same machine (shared machines are noisy, so only same-run
// ratios mean anything):
//
//   - the same 16 MiB read as a file (ReadFile, the files API) through the same path:
//     in-process through roche-agent, and through roched with the Go client;
//   - `docker exec CONTAINER cat FILE` of the same bytes, the engine's own way to stream
//     them out of the container.
//
// It also times a connect that replays nothing (from the end: the command's end only),
// the cost of a connection itself. Medians of -n runs; it asserts nothing about speed,
// and fails only if a step errs or a replay delivers other bytes than the command wrote.
//
//	make bench          (or: go run ./bench/commands -n 20)
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/bench/internal/samples"
	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
)

// size is what the command writes and every measurement moves.
const size = 16 << 20

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "bench/commands: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	n := flag.Int("n", 20, "samples per measurement")
	flag.Parse()
	ctx, stopSignals := samples.Interruptible()
	defer stopSignals()

	dir, err := os.MkdirTemp("", "roche-bench-commands-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	agentPath, err := testenv.BuildAgent(dir)
	if err != nil {
		return err
	}
	p, err := docker.New(docker.WithAgentPath(agentPath))
	if err != nil {
		return err
	}
	defer p.Close()
	c, stop, err := samples.StartDaemon(ctx, daemon.Config{Socket: filepath.Join(dir, "roched.sock")},
		map[string]roche.Provider{"docker": p}, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	defer stop()
	defer c.Close()
	viaRoched := c.Provider("docker")

	cfg := roche.DefaultConfig()
	cfg.Image = testenv.Image()
	cfg.Writable = true // room for the 16 MiB file outside the 64 MiB /tmp's other uses
	sb, err := viaRoched.Create(ctx, cfg)
	if err != nil {
		return err
	}
	defer viaRoched.Destroy(context.WithoutCancel(ctx), sb.ID)

	// One command writes 16 MiB of varied bytes (so that nothing compresses or repeats
	// by accident) and the same bytes to a file, then ends; every replay is of it.
	const file = "/var/tmp/out.bin"
	script := fmt.Sprintf("head -c %d /dev/urandom > %s && cat %s", size, file, file)
	cmd, err := viaRoched.StartCommand(ctx, sb.ID, roche.CommandRequest{Cmd: []string{"sh", "-c", script}, Window: size})
	if err != nil {
		return err
	}
	for {
		list, err := viaRoched.Commands(ctx, sb.ID)
		if err != nil {
			return err
		}
		if len(list) == 1 && !list[0].Running {
			if list[0].End.ExitCode != 0 || list[0].Written.Stdout != size || list[0].First.Stdout != 0 {
				return fmt.Errorf("the command ended as %+v, want exit 0 with all %d bytes kept", list[0], size)
			}
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	var want bytes.Buffer
	if err := p.ReadFile(ctx, sb.ID, file, &want); err != nil {
		return err
	}
	wantSum := sha256.Sum256(want.Bytes())

	sel := roche.CommandSelector{PID: cmd.PID}
	// A replay is checked byte for byte once per path, then measured counting bytes only,
	// as the file reads it is compared with are.
	for _, r := range []roche.BackgroundRunner{p, viaRoched} {
		h := sha256.New()
		if _, err := r.ConnectCommand(ctx, sb.ID, sel, roche.CommandOffsets{}, roche.CommandOutput{Data: func(_ roche.Stream, _ int64, b []byte) error {
			h.Write(b)
			return nil
		}}); err != nil {
			return err
		}
		if !bytes.Equal(h.Sum(nil), wantSum[:]) {
			return fmt.Errorf("a replay delivered other bytes than the command's %d", size)
		}
	}
	replay := func(r roche.BackgroundRunner, from roche.CommandOffsets) func() error {
		return func() error {
			var got int64
			end, err := r.ConnectCommand(ctx, sb.ID, sel, from, roche.CommandOutput{Data: func(_ roche.Stream, _ int64, b []byte) error {
				got += int64(len(b))
				return nil
			}})
			if err != nil {
				return fmt.Errorf("after %d bytes: %w", got, err)
			}
			if from.Stdout == 0 && got != size {
				return fmt.Errorf("a replay delivered %d bytes, want %d", got, size)
			}
			if end.ExitCode != 0 || end.Unknown != "" {
				return fmt.Errorf("the replay ended %+v", end)
			}
			return nil
		}
	}
	readFile := func(fs fileReader) func() error {
		return func() error {
			var cw countWriter
			if err := fs.ReadFile(ctx, sb.ID, file, &cw); err != nil {
				return err
			}
			if cw.n != size {
				return fmt.Errorf("ReadFile read %d bytes, want %d", cw.n, size)
			}
			return nil
		}
	}
	dockerCat := func() error {
		cmd := exec.CommandContext(ctx, "docker", "exec", sb.ID, "cat", file)
		var cw countWriter
		cmd.Stdout = &cw
		if err := cmd.Run(); err != nil {
			return err
		}
		if cw.n != size {
			return fmt.Errorf("docker exec cat wrote %d bytes, want %d", cw.n, size)
		}
		return nil
	}

	fmt.Printf("connect-and-replay of %d MiB of a command's kept output vs. baselines, same run (median of %d)\n\n", size>>20, *n)
	rows := []struct {
		name string
		fn   func() error
	}{
		{"replay 16 MiB, in-process (provider -> agent)", replay(p, roche.CommandOffsets{})},
		{"ReadFile 16 MiB, in-process (baseline)", readFile(p)},
		{"replay 16 MiB, through roched (Go client)", replay(viaRoched, roche.CommandOffsets{})},
		{"ReadFile 16 MiB, through roched (baseline)", readFile(viaRoched)},
		{"docker exec CTR cat FILE, 16 MiB (baseline)", dockerCat},
		{"connect from the end, through roched (no replay)", replay(viaRoched, roche.CommandOffsets{Stdout: -1, Stderr: -1})},
	}
	got := make([][]time.Duration, len(rows))
	for i, r := range rows {
		if got[i], err = measure(ctx, *n, r.fn); err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		med := samples.Median(got[i])
		rate := ""
		if i < 5 {
			rate = fmt.Sprintf("  %6.0f MiB/s", float64(size)/(1<<20)/med.Seconds())
		}
		fmt.Printf("  %-50s p50 %9s%s\n", r.name, samples.Ms(med), rate)
	}
	fmt.Printf("\n  -> replay / ReadFile: in-process %.2f, through roched %.2f; replay through roched is %.1fx docker exec cat's speed\n",
		ratio(got[0], got[1]), ratio(got[2], got[3]), samples.Ratio(got[4], got[2]))
	return nil
}

// ratio is a's median over b's.
func ratio(a, b []time.Duration) float64 {
	return float64(samples.Median(a)) / float64(samples.Median(b))
}

// fileReader is the files call both the provider and roched's client serve.
type fileReader interface {
	ReadFile(ctx context.Context, id, path string, w io.Writer) error
}

type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}

var _ io.Writer = (*countWriter)(nil)

// measure times n runs of fn after one to warm up.
func measure(ctx context.Context, n int, fn func() error) ([]time.Duration, error) {
	if err := fn(); err != nil {
		return nil, err
	}
	out := make([]time.Duration, 0, n)
	for range max(n, 3) {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		start := time.Now()
		if err := fn(); err != nil {
			return nil, err
		}
		out = append(out, time.Since(start))
	}
	return out, nil
}
