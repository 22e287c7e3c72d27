//go:build !unix

package ledger

// lockState has no flock here: one daemon per state file is the operator's to keep.
func lockState(string) (func(), error) { return func() {}, nil }
