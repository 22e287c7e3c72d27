//go:build unix

// Package flock takes exclusive advisory locks (flock(2)) on files and directories, so
// that processes sharing a cache or a state directory (roche and roched, two tests) take
// turns at it.
package flock

import (
	"context"
	"errors"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Lock takes an exclusive lock on path (a file or directory that exists), waiting while
// ctx allows for another process that holds it; the returned func releases it.
func Lock(ctx context.Context, path string) (func(), error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, err
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
