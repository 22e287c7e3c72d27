package kubernetes_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/roche-sandbox/roche/provider/kubernetes"
)

// files lists an image's files: path, mode and size.
func files(t *testing.T, img v1.Image) map[string]*tar.Header {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	out := map[string]*tar.Header{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = h
	}
}

// TestRochedImage: roched and roche-agent side by side (where roched looks for the
// agent), read-only and executable, run as a non-root user; the same binaries make the
// same reference; a binary that needs a loader is refused.
func TestRochedImage(t *testing.T) {
	agent := os.Getenv("ROCHE_AGENT")
	// Any static executable does for roched here: the image does not look inside.
	img, err := kubernetes.RochedImage(agent, agent)
	if err != nil {
		t.Fatal(err)
	}
	fs := files(t, img)
	for _, name := range []string{"usr/local/bin/roched", "usr/local/bin/roche-agent"} {
		h := fs[name]
		if h == nil || h.Typeflag != tar.TypeReg || h.Mode != 0o555 {
			t.Errorf("%s in the image: %+v, want a regular file of mode 0555", name, h)
		}
	}
	if h := fs["usr/local/bin"]; h == nil || h.Typeflag != tar.TypeDir || h.Mode != 0o755 {
		t.Errorf("usr/local/bin in the image: %+v, want a directory of mode 0755", h)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "65532:65532" || len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != kubernetes.RochedBin || cf.OS != "linux" {
		t.Errorf("image config %+v", cf.Config)
	}

	var a, b bytes.Buffer
	refA, err := kubernetes.WriteRochedImage(&a, agent, agent)
	if err != nil {
		t.Fatal(err)
	}
	refB, err := kubernetes.WriteRochedImage(&b, agent, agent)
	if err != nil {
		t.Fatal(err)
	}
	if refA != refB || !strings.HasPrefix(refA, kubernetes.RochedImageRepo+":") || !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Errorf("the same binaries made %s and %s (tarballs equal: %v)", refA, refB, bytes.Equal(a.Bytes(), b.Bytes()))
	}

	if _, err := kubernetes.RochedImage("/bin/sh", agent); err == nil || !strings.Contains(err.Error(), "not a static Linux executable") {
		t.Errorf("a dynamically linked roched: %v", err)
	}
}
