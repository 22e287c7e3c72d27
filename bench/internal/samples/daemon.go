package samples

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/daemon"
)

// StartDaemon runs roched in this process on cfg.Socket with the given providers and
// returns a client for it, and stop, which drains it (safe to call more than once; call
// it to time or check the shutdown, defer it otherwise). Close the client yourself.
func StartDaemon(ctx context.Context, cfg daemon.Config, providers map[string]roche.Provider, log *slog.Logger, opts ...daemon.Option) (*client.Client, func() error, error) {
	d, err := daemon.New(cfg, providers, append([]daemon.Option{daemon.WithLogger(log)}, opts...)...)
	if err != nil {
		return nil, nil, err
	}
	if err := d.Start(ctx); err != nil {
		return nil, nil, err
	}
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		return d.Shutdown(sctx)
	}
	c, err := client.New(client.WithSocket(cfg.Socket))
	if err != nil {
		stop()
		return nil, nil, err
	}
	return c, stop, nil
}

// BackOff is how long a load's client waits after roched refused its create at once:
// the wait the refusal suggests (roche.RetryDelay), else fallback, spread by half
// either way so that the clients refused together do not all come back together.
func BackOff(err error, fallback time.Duration) time.Duration {
	d, ok := roche.RetryDelay(err)
	if !ok {
		d = fallback
	}
	return d/2 + rand.N(d+1)
}
