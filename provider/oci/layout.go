package oci

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// OCI image layouts. A layout names a host directory, which a caller (a tenant of
// roched) may not own: it is read through an os.Root, so that no link inside it leads
// out of it, and opened without following any link when the provider pins layouts
// (WithPinnedLayouts). An unpacked image is cached under its config's digest and used
// for every later create of an image with that config, so what is unpacked must be what
// that config names: the manifest and config are read once and checked against their
// digests, and every layer, as it is unpacked, against the config's diff_id in its
// place (checkedImage). Otherwise a layout holding a well-known image's config over
// layers of its own would leave its own files in the cache for that image.

// maxLayoutJSON bounds an index, manifest or config read from a layout.
const maxLayoutJSON = 16 << 20

// layoutImage is a layout's image, checked so far as it can be before its layers are read.
type layoutImage struct {
	*checkedImage
	// id is the config's digest, hex: the cache key.
	id string
}

// readLayout reads the image of the layout at root: its only manifest, or the one whose
// digest is digest.
func readLayout(root *os.Root, digest string) (*layoutImage, error) {
	b, err := readLimited(root, "index.json")
	if err != nil {
		return nil, fmt.Errorf("not an OCI image layout: %v", err)
	}
	idx, err := v1.ParseIndexManifest(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("not an OCI image layout: index.json: %v", err)
	}
	var pick *v1.Descriptor
	for i, d := range idx.Manifests {
		if digest == "" && len(idx.Manifests) == 1 || d.Digest.String() == digest {
			pick = &idx.Manifests[i]
		}
	}
	if pick == nil {
		return nil, fmt.Errorf("the layout holds %d manifests and none is %q: name one as %s<dir>@sha256:<digest>", len(idx.Manifests), digest, LayoutPrefix)
	}
	if !pick.MediaType.IsImage() {
		return nil, fmt.Errorf("manifest %s is a %s, not an image manifest", pick.Digest, pick.MediaType)
	}
	raw, err := readBlob(root, pick.Digest)
	if err != nil {
		return nil, err
	}
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %v", pick.Digest, err)
	}
	config, err := readBlob(root, m.Config.Digest)
	if err != nil {
		return nil, err
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(config))
	if err != nil {
		return nil, fmt.Errorf("config %s: %v", m.Config.Digest, err)
	}
	if len(m.Layers) != len(cf.RootFS.DiffIDs) {
		return nil, fmt.Errorf("manifest %s lists %d layers and its config %d diff_ids", pick.Digest, len(m.Layers), len(cf.RootFS.DiffIDs))
	}
	img, err := partial.CompressedToImage(&layoutCore{root: root, mediaType: pick.MediaType, manifest: raw, config: config, m: m})
	if err != nil {
		return nil, err
	}
	return &layoutImage{checkedImage: &checkedImage{Image: img, diffIDs: cf.RootFS.DiffIDs}, id: m.Config.Digest.Hex}, nil
}

// blobPath is where a layout keeps the blob of digest h.
func blobPath(h v1.Hash) (string, error) {
	if h.Algorithm != "sha256" || len(h.Hex) != 2*sha256.Size {
		return "", fmt.Errorf("blob digest %q: only sha256 is read", h)
	}
	if _, err := hex.DecodeString(h.Hex); err != nil {
		return "", fmt.Errorf("blob digest %q: %v", h, err)
	}
	return filepath.Join("blobs", h.Algorithm, h.Hex), nil
}

// readBlob reads a small blob (a manifest, a config) and checks it against its digest.
func readBlob(root *os.Root, h v1.Hash) ([]byte, error) {
	name, err := blobPath(h)
	if err != nil {
		return nil, err
	}
	b, err := readLimited(root, name)
	if err != nil {
		return nil, err
	}
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != h.Hex {
		return nil, fmt.Errorf("blob %s does not match its digest", h)
	}
	return b, nil
}

func readLimited(root *os.Root, name string) ([]byte, error) {
	f, err := root.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxLayoutJSON+1))
	if err == nil && len(b) > maxLayoutJSON {
		err = fmt.Errorf("%s is larger than %d bytes", name, maxLayoutJSON)
	}
	return b, err
}

// layoutCore is a layout's image for partial.CompressedToImage: its manifest and config
// as read once, its layers opened through the root when they are unpacked.
type layoutCore struct {
	root             *os.Root
	mediaType        types.MediaType
	manifest, config []byte
	m                *v1.Manifest
}

func (c *layoutCore) RawConfigFile() ([]byte, error)      { return c.config, nil }
func (c *layoutCore) MediaType() (types.MediaType, error) { return c.mediaType, nil }
func (c *layoutCore) RawManifest() ([]byte, error)        { return c.manifest, nil }

func (c *layoutCore) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	if h == c.m.Config.Digest {
		return &layoutBlob{c.root, c.m.Config}, nil
	}
	for _, d := range c.m.Layers {
		if d.Digest == h {
			return &layoutBlob{c.root, d}, nil
		}
	}
	return nil, fmt.Errorf("no layer %s in the manifest", h)
}

type layoutBlob struct {
	root *os.Root
	desc v1.Descriptor
}

func (b *layoutBlob) Digest() (v1.Hash, error)            { return b.desc.Digest, nil }
func (b *layoutBlob) Size() (int64, error)                { return b.desc.Size, nil }
func (b *layoutBlob) MediaType() (types.MediaType, error) { return b.desc.MediaType, nil }

func (b *layoutBlob) Compressed() (io.ReadCloser, error) {
	name, err := blobPath(b.desc.Digest)
	if err != nil {
		return nil, err
	}
	return b.root.Open(name)
}

// checkedImage is an image whose layers are checked, as they are read, against the
// diff_ids of its config, by place: Layers' readers hash what they give, and on Close
// (after reading what the reader of the tar stream left, its end padding) compare it
// with the diff_id; a mismatch is kept for check, which unpack asks once the image is
// unpacked, before the tree is kept.
type checkedImage struct {
	v1.Image
	diffIDs []v1.Hash

	mu       sync.Mutex
	err      error
	verified []bool // by place
}

func (c *checkedImage) Layers() ([]v1.Layer, error) {
	ls, err := c.Image.Layers()
	if err != nil {
		return nil, err
	}
	if len(ls) != len(c.diffIDs) {
		return nil, fmt.Errorf("the image has %d layers and its config %d diff_ids", len(ls), len(c.diffIDs))
	}
	out := make([]v1.Layer, len(ls))
	for i, l := range ls {
		out[i] = &checkedLayer{Layer: l, img: c, place: i}
	}
	return out, nil
}

// check reports a layer that was not what the config names, or one never read through.
func (c *checkedImage) check() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	for i := range c.diffIDs {
		if i >= len(c.verified) || !c.verified[i] {
			return fmt.Errorf("layer %d was not read through", i+1)
		}
	}
	return nil
}

func (c *checkedImage) pass(place int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.verified == nil {
		c.verified = make([]bool, len(c.diffIDs))
	}
	c.verified[place] = true
}

func (c *checkedImage) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.err = errors.Join(c.err, err)
}

type checkedLayer struct {
	v1.Layer
	img   *checkedImage
	place int
}

func (l *checkedLayer) DiffID() (v1.Hash, error) { return l.img.diffIDs[l.place], nil }

func (l *checkedLayer) Uncompressed() (io.ReadCloser, error) {
	rc, err := l.Layer.Uncompressed()
	if err != nil {
		return nil, err
	}
	return &checkedReader{rc: rc, h: sha256.New(), layer: l}, nil
}

type checkedReader struct {
	rc    io.ReadCloser
	h     hash.Hash
	layer *checkedLayer
	done  bool
}

func (r *checkedReader) Read(p []byte) (int, error) {
	n, err := r.rc.Read(p)
	r.h.Write(p[:n])
	return n, err
}

func (r *checkedReader) Close() error {
	if !r.done {
		r.done = true
		want := r.layer.img.diffIDs[r.layer.place]
		if _, err := io.Copy(r.h, r.rc); err != nil {
			r.layer.img.fail(fmt.Errorf("layer %d: %v", r.layer.place+1, err))
		} else if got := hex.EncodeToString(r.h.Sum(nil)); want.Algorithm != "sha256" || got != want.Hex {
			r.layer.img.fail(fmt.Errorf("layer %d is not the one its config names (sha256:%s, the config's diff_id %s)", r.layer.place+1, got, want))
		} else {
			r.layer.img.pass(r.layer.place)
		}
	}
	return r.rc.Close()
}
