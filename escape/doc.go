// Package escape is Roche's escape suite: real attempts to get out of a sandbox, or
// into a neighbour's, run against every provider (docker on runc and on gVisor, oci on
// crun and on runc, kubernetes on the test cluster, qemu, and wasm where a case has a
// surface there), each asserting why it failed: the errno, the guard that stopped it.
//
// It is its own package, not part of provider/providertest, because its output is one
// table across all providers (docs/escapes.md), made from a single run: the conformance
// suite runs inside each provider's package with that package's test set-up, so a
// provider × case table would have to be stitched from six test binaries. Here one test,
// TestEscapes, opens each provider the way roched opens it by default (no test-only
// hardening such as the conformance suite's Localhost seccomp profile on Kubernetes), so
// the table says what a user gets. What the conformance suite already attacks (the copy
// race on a shared mount) is called from providertest, not repeated.
//
//	go test ./escape/                        every provider; fails if docs/escapes.md differs
//	go test ./escape/ -run 'TestEscapes/qemu' one provider (its column is checked)
//	go test ./escape/ -update                rewrites the table from what the run saw
//
// A hole the suite finds that is not fixed yet is listed in knownHoles: the table shows
// it as OPEN, the run stays green, and the run fails once the hole is in fact closed, so
// the list cannot go stale.
package escape
