package kubernetes

import (
	"fmt"
	"io"
	"path"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/roche-sandbox/roche/internal/guest/guestbin"
)

// RochedImageRepo is the repository of the image that runs roched in a cluster
// (deploy/kubernetes). Its tag is the start of the image's digest, so that a new build
// is a new reference and a Deployment naming it rolls.
const RochedImageRepo = "roche/roched"

// RochedBin is roched's path in its image; roche-agent lies beside it, where roched
// finds the agent it names the agent image by (AgentImageRef).
const RochedBin = "/usr/local/bin/roched"

// RochedUID is the user roched's image runs as: not root, and no user of the nodes.
const RochedUID = 65532

// RochedImage builds the image roched runs from in a cluster: one layer holding the
// static roched at RochedBin and roche-agent beside it, run as RochedUID. roched in it
// names the agent image AgentImageRef(agentPath), the one WriteAgentImage makes from the
// same roche-agent.
func RochedImage(rochedPath, agentPath string) (v1.Image, error) {
	return staticImage("the roched image", []imageFile{
		{path: RochedBin, source: rochedPath},
		{path: path.Join(path.Dir(RochedBin), guestbin.Name), source: agentPath},
	}, v1.Config{
		Entrypoint: []string{RochedBin},
		User:       fmt.Sprintf("%d:%d", RochedUID, RochedUID),
		Env:        []string{"PATH=" + path.Dir(RochedBin)},
	})
}

// WriteRochedImage writes the roched image made from rochedPath and agentPath to w as
// an image tarball (as WriteAgentImage does) and returns its reference.
func WriteRochedImage(w io.Writer, rochedPath, agentPath string) (string, error) {
	img, err := RochedImage(rochedPath, agentPath)
	if err != nil {
		return "", err
	}
	digest, err := img.Digest()
	if err != nil {
		return "", fmt.Errorf("naming the roched image: %w", err)
	}
	ref := RochedImageRepo + ":" + digest.Hex[:16]
	return ref, writeImage(w, "the roched image", ref, img)
}
