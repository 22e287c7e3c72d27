// Package guestbin finds the roche-agent binary a provider runs in its sandboxes. It is
// apart from the agent's code (internal/guest/guestcmd) so that providers find the binary
// without linking the agent into themselves.
package guestbin

import (
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
)

// Name is the agent's program name: a Roche binary started under it runs as the agent.
const Name = "roche-agent"

// Env names the variable that sets the agent's path; set and empty, it turns the agent off.
const Env = "ROCHE_AGENT"

// carried is set (guestcmd.RunIfAsked) in a program that can serve as the agent itself.
var carried atomic.Bool

// MarkCarried records that the running program carries the agent: run under the name
// roche-agent, it serves as one.
func MarkCarried() { carried.Store(true) }

// Path is the roche-agent binary to run in sandboxes: $ROCHE_AGENT when set, else
// roche-agent beside the running executable, else the running executable itself if it
// carries the agent (MarkCarried) and is static (a sandbox's image may have no C
// library), else a static roche-agent on PATH (where go install puts it: a program of
// the user's own, run with go run, has nothing beside it). Empty when there is none.
// A relative $ROCHE_AGENT is taken from the current directory, made absolute here: the
// providers use the path from other directories (crun's bundle, a VM's initramfs).
func Path() string {
	if v, ok := os.LookupEnv(Env); ok {
		if v != "" && !filepath.IsAbs(v) {
			if abs, err := filepath.Abs(v); err == nil {
				return abs
			}
		}
		return v
	}
	exe, err := os.Executable()
	if err == nil {
		p := filepath.Join(filepath.Dir(exe), Name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p
		}
		if carried.Load() && Static(exe) {
			return exe
		}
	}
	if p, err := exec.LookPath(Name); err == nil && filepath.IsAbs(p) && Static(p) {
		return p
	}
	return ""
}

// InstallCommand is the command that puts the agent where Path finds it (roche doctor's fix).
const InstallCommand = "CGO_ENABLED=0 go install github.com/roche-sandbox/roche/cmd/roche-agent@latest"

// Install says how a Go user gets the agent where Path finds it.
const Install = InstallCommand + " puts it on PATH " +
	"(from a clone, make build puts it in bin/), or set " + Env + " to its path"

// Static says whether the executable at path needs no dynamic loader.
func Static(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	return StaticELF(f)
}

// StaticELF says whether r holds an ELF executable without a program interpreter: one
// that runs in images of any distribution, or none.
func StaticELF(r io.ReaderAt) bool {
	f, err := elf.NewFile(r)
	if err != nil {
		return false
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return f.Type == elf.ET_EXEC || f.Type == elf.ET_DYN
}
