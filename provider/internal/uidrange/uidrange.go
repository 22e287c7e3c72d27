// Package uidrange is where the providers' sandbox uids come from: each provider's default
// range, side by side here so that two providers sharing a host never hand out the same
// uid (and so never share a user's kernel limits), the check every range passes, and
// the draw. Which uids are taken is each provider's own record (labels, state files).
package uidrange

import (
	"fmt"
	"math/rand/v2"

	"github.com/roche-sandbox/roche"
)

// The default ranges. They lie above every range Linux distributions and systemd hand
// out (regular users, dynamic users, nspawn containers' 524288-1879048191) and below
// 2^31, which some programs store in a signed int.
const (
	// The Docker provider's: sandboxes draw from the first half
	// (1900000000-1900999999), workspaces from the second (1901000000-1901999999).
	DockerFirst = 1_900_000_000
	DockerCount = 2_000_000
	// The oci provider's: the million after the Docker provider's, so that an oci
	// sandbox never shares a uid with a Docker one on the same host.
	OCIFirst = DockerFirst + DockerCount
	OCICount = 1_000_000
	// The kubernetes provider's, on the cluster's nodes rather than this host: the Docker
	// provider's, halved the same way (sandboxes, then workspaces).
	KubernetesFirst = DockerFirst
	KubernetesCount = DockerCount
)

// Check refuses a range of count uids from first that starts below 65536 (the system's
// and regular users' uids), holds fewer than min uids, or ends at 2^31 or beyond.
func Check(first, count, min int) error {
	if first < 65536 || count < min || first+count > 1<<31-1 {
		return fmt.Errorf("%w: uid range %d+%d: start at 65536 or above, hold at least %d uids and end below 2^31",
			roche.ErrInvalidConfig, first, count, min)
	}
	return nil
}

// Draw picks a uid at random from count uids from first. The pick is only a candidate:
// the caller checks it against its record of the uids taken.
func Draw(first, count int) int { return first + rand.IntN(count) }
