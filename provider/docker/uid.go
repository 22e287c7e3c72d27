package docker

import (
	"context"
	"fmt"
	"strconv"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/internal/uidrange"
	"github.com/roche-sandbox/roche/provider/kit"
)

// LabelUID, on a sandbox, is the uid its commands run as (empty when the caller named a
// user only the image knows). Labels are the record of which sandbox uids are taken: a
// uid is free again when the container that carries it is gone. (A workspace's uid is
// in its record; see recordWithUID.)
const LabelUID = "roche.uid"

// The default uid range (provider/internal/uidrange). Sandboxes draw from its first
// half, workspaces from its second: 1900000000-1900999999 and 1901000000-1901999999.
const (
	DefaultUIDFirst = uidrange.DockerFirst
	DefaultUIDCount = uidrange.DockerCount
)

// maxUIDDraws bounds how often Create draws again after finding its uid taken: with a
// million uids to a half and a few thousand sandboxes, a second draw is already rare.
const maxUIDDraws = 8

// WithUIDRange sets the range uids are drawn from (DefaultUIDFirst, DefaultUIDCount):
// count uids from first, the first half for sandboxes and the second for workspaces.
// Choose one no host user or other tool uses.
func WithUIDRange(first, count int) Option {
	return func(p *Provider) { p.uidFirst, p.uidCount = first, count }
}

func (p *Provider) checkUIDRange() error { return uidrange.Check(p.uidFirst, p.uidCount, 2) }

// inRange reports whether uid is one this provider hands out.
func (p *Provider) inRange(uid int) bool {
	return uid >= p.uidFirst && uid < p.uidFirst+p.uidCount
}

// drawSandboxUID and drawWorkspaceUID pick a uid at random from their half of the range.
// The pick is only a candidate: the caller records it in a label, then checks that no
// other holder has it (see createContainer).
func (p *Provider) drawSandboxUID() int { return uidrange.Draw(p.uidFirst, p.uidCount/2) }

func (p *Provider) drawWorkspaceUID() int {
	half := p.uidCount / 2
	return uidrange.Draw(p.uidFirst+half, p.uidCount-half)
}

// runAs is who a sandbox's commands run as.
type runAs struct {
	// user goes to Docker (--user) or to roche-agent: "uid:gid" or the caller's spec.
	user string
	// uid is the numeric uid, -1 when the caller named a user only the image knows.
	uid int
	// draw: the uid is drawn for this sandbox alone, and checked once labelled.
	draw bool
	// chownFrom, when positive, is the uid of the sandbox a snapshot was taken of: the
	// files it left on the (writable) root filesystem are handed to this sandbox's user.
	chownFrom int
}

func (r runAs) label() string {
	if r.uid < 0 {
		return ""
	}
	return strconv.Itoa(r.uid)
}

// runAsFor decides who cfg's commands run as: the caller's user as given; with
// roche.UserAuto, the workspace's uid when there is a workspace (ws, made by
// ensureWorkspace; -1 for a workspace made before uids were given out, whose sandboxes
// each draw one), else a uid drawn for the sandbox. snapshotUID is the uid recorded on
// the snapshot the sandbox is made from (-1: none).
func (p *Provider) runAsFor(cfg roche.Config, ws, snapshotUID int) runAs {
	var r runAs
	switch {
	case cfg.User != roche.UserAuto:
		r = runAs{user: cfg.User, uid: kit.UID(cfg)}
	case ws >= 0:
		r = runAs{user: fmt.Sprintf("%d:%d", ws, ws), uid: ws}
	default:
		r = runAs{uid: -1, draw: true}
	}
	// Only a uid Roche handed out is taken over: a caller's own uid, root's above all,
	// keeps its files. A read-only root cannot change hands, nor be changed: there the
	// sandbox reads what the files let others read.
	if cfg.Writable && p.inRange(snapshotUID) {
		r.chownFrom = snapshotUID
	}
	return r
}

// uidOf reads a LabelUID value; -1 when absent or not a uid.
func uidOf(labels map[string]string) int {
	v, ok := labels[LabelUID]
	if !ok {
		return -1
	}
	uid, err := strconv.Atoi(v)
	if err != nil || uid < 0 {
		return -1
	}
	return uid
}

// uidTakenElsewhere reports whether a container other than id carries uid. Every
// process that creates sandboxes (the CLI in direct mode, any number of roched, on
// behalf of any host user) labels its container before starting it and then looks, so
// of two containers given the same uid at the same moment at least one sees the other
// and draws again: the engine's list is the one shared record, and no lock is needed.
func (p *Provider) uidTakenElsewhere(ctx context.Context, uid int, id string) (bool, error) {
	cs, err := p.containers(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(
		filters.Arg("label", LabelUID+"="+strconv.Itoa(uid)))})
	if err != nil {
		return false, p.engineErr("listing the sandboxes' uids", err)
	}
	for _, c := range cs {
		if c.ID != id {
			return true, nil
		}
	}
	return false, nil
}

func noFreeUID(what string, first, count int) error {
	return fmt.Errorf("%w: no free uid for a %s after %d draws from %d-%d: the range is nearly full; widen it (WithUIDRange)",
		roche.ErrUnavailable, what, maxUIDDraws, first, first+count-1)
}
