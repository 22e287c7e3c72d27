// Package samples holds what every benchmark program under bench/ shares: percentiles
// of timings, same-run ratios, and the seeds' raw `docker run` wrapper as the baseline.
package samples

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	dockerclient "github.com/docker/docker/client"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// Percentile is the nearest-rank percentile p (0-100) of ds; 0 for no samples.
func Percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (p*len(s)+99)/100 - 1
	return s[max(0, min(i, len(s)-1))]
}

// Median is Percentile(ds, 50).
func Median(ds []time.Duration) time.Duration { return Percentile(ds, 50) }

// Ratio is how many times a's median is b's: a same-run comparison.
func Ratio(a, b []time.Duration) float64 {
	return float64(Median(a)) / float64(max(Median(b), 1))
}

// Ms formats a duration in milliseconds with two decimals.
func Ms(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000)
}

// RawDockerRun times the seeds' hand-written wrapper, `docker run --rm --network=none
// --read-only ... IMAGE python3 -c CODE`, and checks it printed want. Its container is
// labelled like Roche's, so the suite's leak checks see it if it is ever left behind.
func RawDockerRun(ctx context.Context, image, code, want string) (time.Duration, error) {
	start := time.Now()
	out, err := exec.CommandContext(ctx, "docker", "run", "--rm", "--network=none", "--read-only", "--memory=512m",
		"--cpus=1", "--security-opt=no-new-privileges", "--pids-limit=64", "--label", "roche.managed=true",
		image, "python3", "-c", code).Output()
	d := time.Since(start)
	if err != nil || string(out) != want {
		return 0, fmt.Errorf("docker run: %q %v", out, err)
	}
	return d, nil
}

// ContainersOf lists the Roche containers made from img.
func ContainersOf(ctx context.Context, dc *dockerclient.Client, img string) ([]string, error) {
	list, err := dc.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", "roche.managed=true"))})
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, c := range list {
		if c.Image == img {
			ids = append(ids, c.ID)
		}
	}
	return ids, nil
}

// Engine connects to the Docker engine, saying how to start it when it does not answer.
func Engine(ctx context.Context) (*dockerclient.Client, error) {
	dc, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		return nil, err
	}
	if _, err := dc.Ping(ctx); err != nil {
		dc.Close()
		return nil, fmt.Errorf("the Docker engine does not answer (%v): start it (make test does)", err)
	}
	return dc, nil
}

// PrivateTag tags base as roche/python:PREFIX-XXXX, a name of this run's own, so that
// ContainersOf tells its containers from anyone else's on the engine. remove untags it.
func PrivateTag(ctx context.Context, dc *dockerclient.Client, base, prefix string) (img string, remove func(), err error) {
	b := make([]byte, 4)
	rand.Read(b)
	img = "roche/python:" + prefix + "-" + hex.EncodeToString(b)
	if err := dc.ImageTag(ctx, base, img); err != nil {
		return "", nil, fmt.Errorf("tagging %s: %v (scripts/build-test-image.sh builds it)", base, err)
	}
	return img, func() { dc.ImageRemove(context.Background(), img, image.RemoveOptions{}) }, nil
}

// SetupAgent builds roche-agent (unless ROCHE_AGENT names one), so the Docker provider
// runs commands through the agent as it does in production.
func SetupAgent() (string, func(), error) {
	if p := os.Getenv("ROCHE_AGENT"); p != "" {
		return "transport agent (" + p + ")", func() {}, nil
	}
	dir, err := os.MkdirTemp("", "rbench-agent")
	if err != nil {
		return "", nil, err
	}
	out, err := testenv.BuildAgent(dir)
	if err != nil {
		os.RemoveAll(dir)
		// Measure anyway, and say so: the daemon's figures still mean something.
		first, _, _ := strings.Cut(strings.TrimSpace(err.Error()), "\n")
		return "transport docker-exec (" + first + ")", func() {}, nil
	}
	os.Setenv("ROCHE_AGENT", out)
	return "transport agent (built from ./cmd/roche-agent)", func() { os.RemoveAll(dir) }, nil
}
