//go:build !linux

package supervisor

import "errors"

// Main is never reached off Linux.
func Main(args []string) error { return errors.New("microVMs run on Linux only") }
