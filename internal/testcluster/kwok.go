package testcluster

import (
	"fmt"
	"strconv"
)

// Simulated nodes (kwok) beside the real one, for scale tests of the control plane:
// scripts/k8s/cluster.sh up --kwok N starts kwok when it is not running (on a cluster
// already up, leaving the rest alone) and makes nodes kwok-node-1..N when missing.

// KwokSelector picks the kwok nodes (their label), and KwokTaint is the taint
// (NoSchedule) that keeps every other Pod off them.
const (
	KwokSelector = "type=kwok"
	KwokTaint    = "kwok.x-k8s.io/node"
)

// StartKwok brings the test cluster up when it is not, with kwok and at least nodes
// simulated nodes, and returns its description (an error, not a failed test, so that
// benchmarks can call it too).
func StartKwok(nodes int) (*Cluster, error) {
	if nodes < 1 {
		return nil, fmt.Errorf("kwok needs at least one node, not %d", nodes)
	}
	upOnce.Lock()
	defer upOnce.Unlock()
	out, err := script("up", "--kwok", strconv.Itoa(nodes))
	if err != nil {
		return nil, fmt.Errorf("starting the test cluster with %d kwok nodes (scripts/k8s/cluster.sh up --kwok %d): %v\n%s", nodes, nodes, err, out)
	}
	upDone = true
	return load()
}
