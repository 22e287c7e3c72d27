//go:build !linux

package oci

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"time"
)

// The oci provider needs Linux (namespaces, overlayfs, an OCI runtime); elsewhere every
// create is refused by New's check and these are never reached.

var errNotLinux = errors.New("the oci provider needs Linux")

func mountOverlay(string, string, string, string, string) error { return errNotLinux }
func unmountAll(string) error                                   { return nil }
func lockPath(context.Context, string) (func(), error)          { return nil, errNotLinux }
func mountsBelow(...string) []string                            { return nil }
func exitWaiter(int) (func(time.Duration) bool, bool)           { return nil, false }
func hybridCgroups() bool                                       { return false }
func cgroupControllers() []string                               { return nil }
func startWithoutUnified(*exec.Cmd) error                       { return errNotLinux }
func sealBinary(string) (*os.File, error)                       { return nil, errNotLinux }
func stateOnTmpfs(context.Context, string) (bool, error)        { return false, nil }

func (*Provider) openLayout(string) (*os.Root, error) { return nil, errNotLinux }

type socketWatch struct{}

func watchSocket(string) *socketWatch     { return nil }
func (*socketWatch) wait(context.Context) {}
func (*socketWatch) close()               {}

func (*Provider) claimSweep(time.Duration) bool { return true }
