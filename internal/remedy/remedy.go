// Package remedy words a roche.Remedy (an error that says what command fixes it) for
// whoever reads it at each of Roche's edges: a person at the command line, a program
// through roched's API or an SDK, a model through roche mcp. A Go program calling a
// provider in its own process reads the Remedy's own Error, worded for it.
package remedy

import (
	"errors"
	"fmt"
	"strings"

	"github.com/roche-sandbox/roche"
)

// Audience is who reads an error.
type Audience int

const (
	// ForCLI is a person running roche.
	ForCLI Audience = iota + 1
	// ForClient is a program reaching a provider through roched's API or an SDK
	// (which may use the CLI underneath, with --json).
	ForClient
	// ForModel is a model calling roche mcp's tools.
	ForModel
)

// Advise words err for a: the text of the Remedy in its chain, if any, replaced with
// its advice for a.
func Advise(err error, a Audience) string {
	msg := err.Error()
	var r *roche.Remedy
	if errors.As(err, &r) {
		return strings.Replace(msg, r.Error(), advice(r, a), 1)
	}
	return msg
}

// advice words r and its fix for a.
func advice(r *roche.Remedy, a Audience) string {
	run := r.Run
	if r.AsRoot {
		run += " (as root)"
	}
	msg := r.Err.Error()
	switch a {
	case ForCLI:
		msg += ": run " + run
		if r.Image != "" {
			msg += ", then pass --image " + r.Image
		}
	case ForClient:
		msg += ": make it on the host that runs the sandboxes (roched's, when you use roched) with " + run
		if r.Image != "" {
			msg += fmt.Sprintf(", then create sandboxes with image %q", r.Image)
		}
	case ForModel:
		msg += ": this server's host lacks it; tell the user, who can make it there with " + run
		if r.Image != "" {
			msg += fmt.Sprintf(", and then call create_sandbox with image %q", r.Image)
		}
	default:
		return r.Error()
	}
	return msg
}
