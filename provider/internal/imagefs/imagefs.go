// Package imagefs is what the providers that run a sandbox from an unpacked image (oci,
// the microVMs) share of it: the image's lookup in the local Docker engine, and the
// unpacking of its filesystem into a directory, through the one tar extraction path
// (internal/tarfs.ExtractTree).
package imagefs

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/client"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/tarfs"
	"github.com/roche-sandbox/roche/provider/internal/engine"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Image is what a sandbox needs of a Docker image's config.
type Image struct {
	ID      string // the config digest, hex: what an unpacked image is cached under
	Env     []string
	Workdir string
}

// Inspect asks the Docker engine cli, named eng, for image ref, within
// engine.ControlTimeout. The errors say what the caller does with Docker images (uses:
// "the oci provider unpacks Docker images, or OCI layouts named oci-layout:/dir") and,
// when the engine cannot be reached, what to do (start: "start it (sudo dockerd &)").
func Inspect(ctx context.Context, cli *client.Client, eng engine.Engine, ref, uses, start string) (Image, error) {
	ictx, done := eng.Bound(ctx, "inspecting image "+ref, engine.ControlTimeout)
	ins, err := cli.ImageInspect(ictx, ref)
	done(&err)
	var notAnswering *engine.NotAnsweringError
	switch {
	case err == nil:
	case errors.As(err, &notAnswering):
		return Image{}, notAnswering
	case cerrdefs.IsNotFound(err):
		return Image{}, &roche.Remedy{Err: fmt.Errorf("%w: image %s is not in the local Docker engine (%s)", roche.ErrImageNotFound, ref, uses),
			Run: "roche image build python", AsRoot: true, Image: "roche/python:local"}
	case client.IsErrConnectionFailed(err):
		return Image{}, fmt.Errorf("%w: %s, and the Docker engine is not reachable at %s: %s", roche.ErrUnavailable, uses, cli.DaemonHost(), start)
	default:
		return Image{}, fmt.Errorf("inspecting image %s: %w", ref, err)
	}
	img := Image{ID: strings.TrimPrefix(ins.ID, "sha256:")}
	if _, err := hex.DecodeString(img.ID); err != nil || img.ID == "" {
		return Image{}, fmt.Errorf("image %s has an unexpected id %q", ref, ins.ID)
	}
	if ins.Config != nil {
		img.Env, img.Workdir = ins.Config.Env, ins.Config.WorkingDir
	}
	return img, nil
}

// Unpack writes an image's filesystem, a tar stream (a flattened image, a container's
// export), into dir, an existing directory, as the image has it: owners, modes with
// their set-id bits, times, symlinks wherever they point (they are resolved inside the
// sandbox) and hard links within the tree. Nothing lands outside dir, nor is written
// through a link (tarfs.ExtractTree). Devices, fifos and extended attributes are made
// only for a root that a kernel of the sandbox's own mounts (ownKernel: a microVM's);
// a container gets its /dev from the runtime.
func Unpack(r io.Reader, dir string, ownKernel bool) (tarfs.Report, error) {
	return tarfs.ExtractTree(r, dir, tarfs.TreeOptions{Devices: ownKernel, Xattrs: ownKernel})
}

// Diagnose is the "image" finding of roche doctor for a provider that reads ref from the
// Docker engine cli (Inspect's arguments), with the command that fixes what is missing:
// the image built, or the engine started (restarted when it hangs).
func Diagnose(ctx context.Context, cli *client.Client, eng engine.Engine, ref, uses, start string) kit.Finding {
	img, err := Inspect(ctx, cli, eng, ref, uses, start)
	if err == nil {
		return kit.Found("image", nil, fmt.Sprintf("%s (%.12s) in the Docker engine at %s", ref, img.ID, cli.DaemonHost()))
	}
	fix := "systemctl start docker"
	if errors.Is(err, roche.ErrTimeout) {
		fix = "systemctl restart docker"
	}
	return kit.Lacks("image", err, fix, true)
}
