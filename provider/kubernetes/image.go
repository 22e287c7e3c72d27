package kubernetes

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/roche-sandbox/roche/agent/agentbin"
	"github.com/roche-sandbox/roche/agent/podlink"
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
	bin, err := os.ReadFile(agentPath)
	if err != nil {
		return nil, fmt.Errorf("reading roche-agent for the agent image: %w", err)
	}
	if !agentbin.StaticELF(bytes.NewReader(bin)) {
		return nil, fmt.Errorf("%s is not a static Linux executable: build it with CGO_ENABLED=0 (make build)", agentPath)
	}
	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	hdr := &tar.Header{
		Name: strings.TrimPrefix(podlink.ImageAgent, "/"), Mode: 0o555, Size: int64(len(bin)),
		Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0), Format: tar.FormatPAX,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar.Bytes())), nil
	})
	if err != nil {
		return nil, fmt.Errorf("making the agent image's layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, fmt.Errorf("making the agent image: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Entrypoint = []string{podlink.ImageAgent}
	cf.Config.User = "0:0"
	cf.Config.Labels = map[string]string{LabelManaged: "true"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("configuring the agent image: %w", err)
	}
	return mutate.CreatedAt(img, v1.Time{Time: time.Unix(0, 0)})
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
	tag, err := name.NewTag(ref)
	if err != nil {
		return "", err
	}
	if err := tarball.Write(tag, img, w); err != nil {
		return "", fmt.Errorf("writing the agent image: %w", err)
	}
	return ref, nil
}
