package faults

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	dockerclient "github.com/docker/docker/client"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/provider/kit"
)

// holdBound is how soon a client's hold ends once its sandbox is gone: roched looks
// every second.
const holdBound = time.Second

// TestHoldEndsWhenItsSandboxGoes: a client holding a leased sandbox through roched hears,
// within about a second, that the sandbox went under it, and why: another client
// destroyed it, its lifetime ended, or it was killed behind roched's back.
func TestHoldEndsWhenItsSandboxGoes(t *testing.T) {
	real := realProvider(t)
	img := privateImage(t)
	rd := startRoched(t, "unix://"+dockerSocket, time.Second)
	other, err := client.New(client.WithSocket(rd.socket))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	dc, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	ctx := context.Background()

	cases := []struct {
		name     string
		lifetime int
		end      func(t *testing.T, id string) // nil: its lifetime ends
		want     string
	}{
		{"destroyed by another client", 300, func(t *testing.T, id string) {
			if err := other.Provider("docker").Destroy(ctx, id); err != nil {
				t.Fatal(err)
			}
		}, "was destroyed (roche destroy, or another client of roched)"},
		{"its lifetime ended", 3, nil, "was destroyed: its lifetime ended at"},
		{"killed behind roched's back", 300, func(t *testing.T, id string) {
			if err := dc.ContainerKill(ctx, id, "KILL"); err != nil {
				t.Fatal(err)
			}
		}, "ended at"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := roche.DefaultConfig()
			cfg.Image = img
			cfg.TimeoutSecs = c.lifetime
			sb, _, err := rd.c.CreateFor(ctx, "docker", cfg, kit.CreateOptions{Leased: true})
			if err != nil {
				t.Fatal(err)
			}
			defer rd.provider.Destroy(ctx, sb.ID)
			if err := rd.c.Holding(sb.ID); err != nil {
				t.Fatalf("a leased sandbox just made is not held: %v", err)
			}
			var ended time.Time
			if c.end != nil {
				time.Sleep(time.Second) // held, by now
				c.end(t, sb.ID)
				ended = time.Now()
			} else {
				ended = sb.ExpiresAt
				time.Sleep(time.Until(ended) - 500*time.Millisecond)
				if err := rd.c.Holding(sb.ID); err != nil {
					t.Fatalf("the hold ended before the sandbox's lifetime did: %v", err)
				}
			}
			// Its lifetime's end is found by the reaper, which looks every second.
			eventually(t, holdBound+time.Second+margin, "the hold to end", func() bool { return rd.c.Holding(sb.ID) != nil })
			took := time.Since(ended)
			err = rd.c.Holding(sb.ID)
			if !errors.Is(err, roche.ErrNotFound) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("the hold ended with %v; want NOT_FOUND, one line saying %q", err, c.want)
			}
			t.Logf("the hold ended %v after the sandbox went: %v", took.Round(100*time.Millisecond), err)
		})
	}
	rd.destroyAll(t)
	noneLeft(t, real, img, 30*time.Second)
}
