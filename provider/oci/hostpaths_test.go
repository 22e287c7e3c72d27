package oci_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/oci"
)

// layer is an image layer of files, uncompressed.
func layer(t *testing.T, files map[string]string) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, body := range files {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(body))
	}
	tw.Close()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// writeImageLayout writes img as the only image of a new layout at dir.
func writeImageLayout(t *testing.T, dir string, img v1.Image) {
	t.Helper()
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
}

// forge writes at dir a layout whose image has genuine's config, byte for byte (so the
// same config digest), over layers of the forger's choosing: what a tenant who knows a
// well-known image's config could write.
func forge(t *testing.T, dir string, genuine v1.Image, layers ...v1.Layer) {
	t.Helper()
	writeImageLayout(t, dir, empty.Image) // index.json, oci-layout, blobs/
	raw, err := genuine.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	m, err := genuine.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	blob := func(b []byte) v1.Hash {
		sum := sha256.Sum256(b)
		h := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
		if err := os.WriteFile(filepath.Join(dir, "blobs", "sha256", h.Hex), b, 0o644); err != nil {
			t.Fatal(err)
		}
		return h
	}
	blob(raw)
	forged := *m
	forged.Layers = nil
	for _, l := range layers {
		rc, err := l.Compressed()
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		mt, _ := l.MediaType()
		forged.Layers = append(forged.Layers, v1.Descriptor{MediaType: mt, Size: int64(len(b)), Digest: blob(b)})
	}
	mb, _ := json.Marshal(forged)
	mh := blob(mb)
	idx := v1.IndexManifest{SchemaVersion: 2, MediaType: "application/vnd.oci.image.index.v1+json",
		Manifests: []v1.Descriptor{{MediaType: m.MediaType, Size: int64(len(mb)), Digest: mh}}}
	ib, _ := json.Marshal(idx)
	if err := os.WriteFile(filepath.Join(dir, "index.json"), ib, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestLayoutCannotPoisonTheCache: an unpacked image is cached under its config's
// digest and served to every later create with that config. Layouts holding a genuine
// image's config over other layers (a layer of their own, one layer fewer, one layer
// twice) are refused, leaving nothing in the cache; the genuine image, made afterwards,
// has its own files.
func TestLayoutCannotPoisonTheCache(t *testing.T) {
	p, _ := newProvider(t)
	ctx := context.Background()
	base := layer(t, map[string]string{"hello.txt": "genuine\n"})
	patch := layer(t, map[string]string{"patch.txt": "patched\n"})
	genuine, err := mutate.AppendLayers(empty.Image, base, patch)
	if err != nil {
		t.Fatal(err)
	}
	if genuine, err = mutate.Config(genuine, v1.Config{Env: []string{"STAMP=" + time.Now().String()}}); err != nil {
		t.Fatal(err)
	}
	name, err := genuine.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	entry := filepath.Join("/var/lib/roche-test/oci/images", name.Hex)
	t.Cleanup(func() { os.RemoveAll(entry) })

	evil := layer(t, map[string]string{"hello.txt": "forged\n", "patch.txt": "patched\n"})
	for _, c := range []struct {
		what   string
		layers []v1.Layer
		says   string
	}{
		{"a layer of its own", []v1.Layer{base, evil}, "layer 2 is not the one its config names"},
		{"its own first", []v1.Layer{evil, patch}, "layer 1 is not the one its config names"},
		{"one layer fewer", []v1.Layer{base}, "lists 1 layers and its config 2 diff_ids"},
		{"one layer twice", []v1.Layer{base, base}, "layer 2 is not the one its config names"},
	} {
		dir := t.TempDir()
		forge(t, dir, genuine, c.layers...)
		cfg := testConfig()
		cfg.Image = oci.LayoutPrefix + dir
		info, err := p.Create(ctx, cfg)
		if err == nil {
			p.Destroy(ctx, info.ID)
			t.Fatalf("a layout with the genuine config over %s made sandbox %s", c.what, info.ID)
		}
		if !errors.Is(err, roche.ErrImageNotFound) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("a layout with the genuine config over %s: %v, want ErrImageNotFound saying %q", c.what, err, c.says)
		}
		if _, err := os.Stat(entry); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("after the layout over %s the cache holds an entry for the genuine config: %v", c.what, err)
		}
	}

	dir := t.TempDir()
	writeImageLayout(t, dir, genuine)
	cfg := testConfig()
	cfg.Image = oci.LayoutPrefix + dir
	info, err := p.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Destroy(ctx, info.ID)
	for file, want := range map[string]string{"/hello.txt": "genuine\n", "/patch.txt": "patched\n"} {
		var got bytes.Buffer
		if err := p.ReadFile(ctx, info.ID, file, &got); err != nil || got.String() != want {
			t.Errorf("%s of the genuine image: %q %v, want %q", file, got.String(), err, want)
		}
	}
}

// TestPinnedLayouts: with WithPinnedLayouts (roched's), a layout's path is opened
// without following links: one through a link is refused, which a provider without it
// follows. Inside a layout, no link leads out of it with either: blobs that are a link
// to another layout's are refused.
func TestPinnedLayouts(t *testing.T) {
	ctx := context.Background()
	img, err := mutate.AppendLayers(empty.Image, layer(t, map[string]string{"hello.txt": "through a link\n"}))
	if err != nil {
		t.Fatal(err)
	}
	if img, err = mutate.Config(img, v1.Config{Env: []string{"STAMP=" + time.Now().String()}}); err != nil {
		t.Fatal(err)
	}
	name, _ := img.ConfigName()
	t.Cleanup(func() { os.RemoveAll(filepath.Join("/var/lib/roche-test/oci/images", name.Hex)) })
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	writeImageLayout(t, real, img)
	os.Symlink(real, filepath.Join(dir, "link"))
	borrowed := filepath.Join(dir, "borrowed")
	os.Mkdir(borrowed, 0o755)
	for _, f := range []string{"index.json", "oci-layout"} {
		b, _ := os.ReadFile(filepath.Join(real, f))
		os.WriteFile(filepath.Join(borrowed, f), b, 0o644)
	}
	os.Symlink(filepath.Join(real, "blobs"), filepath.Join(borrowed, "blobs"))
	create := func(p *oci.Provider, path string) error {
		cfg := testConfig()
		cfg.Image = oci.LayoutPrefix + path
		info, err := p.Create(ctx, cfg)
		if err == nil {
			p.Destroy(ctx, info.ID)
		}
		return err
	}

	pinned, _ := newProvider(t, oci.WithPinnedLayouts())
	if !pinned.PinsLayouts() {
		t.Fatal("WithPinnedLayouts: PinsLayouts is false")
	}
	for _, path := range []string{filepath.Join(dir, "link"), real + "/.", borrowed} {
		if err := create(pinned, path); !errors.Is(err, roche.ErrImageNotFound) {
			t.Errorf("pinned, the layout at %s: %v, want ErrImageNotFound", path, err)
		}
	}
	if err := create(pinned, real); err != nil {
		t.Errorf("pinned, the layout at its own path: %v", err)
	}
	t.Run("unpinned", func(t *testing.T) {
		p, _ := newProvider(t)
		if err := create(p, filepath.Join(dir, "link")); err != nil {
			t.Errorf("unpinned, the layout through a link: %v", err)
		}
		if err := create(p, borrowed); !errors.Is(err, roche.ErrImageNotFound) {
			t.Errorf("unpinned, the layout whose blobs are a link out of it: %v, want ErrImageNotFound", err)
		}
	})
}
