package kubernetes

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/roche-sandbox/roche/internal/guest/guestbin"
	"github.com/roche-sandbox/roche/internal/guest/podlink"
)

// AgentImageRepo is the repository of the agent image. Its tag is the start of the
// agent binary's SHA-256, so that a node never runs an agent other than the one the
// provider was built with, and the same binary always makes the same image.
const AgentImageRepo = "roche/agent"

// AgentImageRef is the reference of the agent image made from the roche-agent binary at
// agentPath: AgentImageRepo, tagged with the binary's digest.
func AgentImageRef(agentPath string) (string, error) {
	f, err := os.Open(agentPath)
	if err != nil {
		return "", fmt.Errorf("reading roche-agent to name the agent image: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("reading roche-agent to name the agent image: %w", err)
	}
	return AgentImageRepo + ":" + hex.EncodeToString(h.Sum(nil))[:16], nil
}

// AgentImage builds the agent image: one layer holding the static roche-agent at
// podlink.ImageAgent, on an empty base, run as root. Timestamps are fixed, so the same
// binary gives the same image digest.
func AgentImage(agentPath string) (v1.Image, error) {
	return staticImage("the agent image", []imageFile{{path: podlink.ImageAgent, source: agentPath}}, v1.Config{
		Entrypoint: []string{podlink.ImageAgent},
		User:       "0:0",
	})
}

// WriteAgentImage writes the agent image made from agentPath to w as a tarball that
// container runtimes import (ctr images import, docker load) and registry tools push
// (crane push), and returns its reference.
func WriteAgentImage(w io.Writer, agentPath string) (string, error) {
	ref, err := AgentImageRef(agentPath)
	if err != nil {
		return "", err
	}
	img, err := AgentImage(agentPath)
	if err != nil {
		return "", err
	}
	return ref, writeImage(w, "the agent image", ref, img)
}

// imageFile is one static executable of an image Roche writes.
type imageFile struct {
	// path is where it goes in the image, absolute.
	path string
	// source is the binary on this host.
	source string
}

// staticImage builds an image of one layer holding files, each a static Linux executable
// (mode 0555, its directories 0755), on an empty base, configured with cfg. Timestamps
// are fixed, so the same binaries give the same image digest. what names the image in
// errors.
func staticImage(what string, files []imageFile, cfg v1.Config) (v1.Image, error) {
	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	epoch := time.Unix(0, 0)
	dirs := map[string]bool{}
	for _, f := range files {
		bin, err := os.ReadFile(f.source)
		if err != nil {
			return nil, fmt.Errorf("reading %s for %s: %w", path.Base(f.path), what, err)
		}
		if !guestbin.StaticELF(bytes.NewReader(bin)) {
			return nil, fmt.Errorf("%s is not a static Linux executable: build it with CGO_ENABLED=0 (make build)", f.source)
		}
		name := strings.TrimPrefix(path.Clean(f.path), "/")
		// Parents first, as tar tools write them, so the runtime makes them 0755.
		var parents []string
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if dirs[d] {
				continue
			}
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Name: d + "/", Mode: 0o755, Typeflag: tar.TypeDir, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		}
		hdr := &tar.Header{Name: name, Mode: 0o555, Size: int64(len(bin)), Typeflag: tar.TypeReg, ModTime: epoch, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(bin); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar.Bytes())), nil
	})
	if err != nil {
		return nil, fmt.Errorf("making the layer of %s: %w", what, err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, fmt.Errorf("making %s: %w", what, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config = cfg
	cf.Config.Labels = map[string]string{LabelManaged: "true"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("configuring %s: %w", what, err)
	}
	return mutate.CreatedAt(img, v1.Time{Time: epoch})
}

// writeImage writes img, tagged ref, to w as an image tarball.
func writeImage(w io.Writer, what, ref string, img v1.Image) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	if err := tarball.Write(tag, img, w); err != nil {
		return fmt.Errorf("writing %s: %w", what, err)
	}
	return nil
}
