package oci

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/internal/imagefs"
)

// LayoutPrefix, before a directory, names an image in an OCI image layout instead of
// the local Docker engine: "oci-layout:/srv/images/python" (the layout's only image) or
// "oci-layout:/srv/images/python@sha256:..." (one manifest of its index).
const LayoutPrefix = "oci-layout:"

// imageRoot is an image unpacked into the cache: a directory tree used as the read-only
// lower layer of every sandbox made from it, with what the sandbox needs of the image's
// config.
type imageRoot struct {
	ID      string   `json:"id"` // the image's config digest, hex: the cache key
	Env     []string `json:"env"`
	Workdir string   `json:"workdir"`
	dir     string   // the unpacked tree
}

// image returns the unpacked root of ref, unpacking it into the cache the first time.
// Docker images are named by their digest through the Engine API (one inspect); when the
// engine does not answer, an image unpacked before under the same name is used.
func (p *Provider) image(ctx context.Context, ref string) (imageRoot, error) {
	if dir, ok := strings.CutPrefix(ref, LayoutPrefix); ok {
		return p.layoutImage(ctx, dir)
	}
	id, err := p.recentID(ctx, ref)
	if err != nil {
		if known, ok := p.knownRef(ref); ok && errors.Is(err, roche.ErrUnavailable) {
			p.log.Warn("the Docker engine does not answer; using the image unpacked before under this name", "image", ref, "err", err)
			return known, nil
		}
		return imageRoot{}, err
	}
	root, err := p.cached(ctx, id, func() (v1.Image, func(), error) { return p.savedImage(ctx, ref, id) })
	if err == nil {
		p.rememberRef(ref, id)
	}
	return root, err
}

// refTTL is how long a Docker image name's id is trusted without asking the engine
// again: a create does not pay an Engine API round trip (milliseconds, tens on a busy
// engine) when another create just asked, and an image tagged anew is seen this late at
// most.
const refTTL = 10 * time.Second

type recentRef struct {
	id string
	at time.Time
}

// recentID is dockerImageID, remembered for refTTL.
func (p *Provider) recentID(ctx context.Context, ref string) (string, error) {
	p.refsMu.Lock()
	r, ok := p.refs[ref]
	p.refsMu.Unlock()
	if ok && time.Since(r.at) < refTTL {
		return r.id, nil
	}
	id, err := p.dockerImageID(ctx, ref)
	if err != nil {
		return "", err
	}
	p.refsMu.Lock()
	if p.refs == nil {
		p.refs = map[string]recentRef{}
	}
	p.refs[ref] = recentRef{id, time.Now()}
	p.refsMu.Unlock()
	return id, nil
}

// dockerImageID asks the engine for ref's image id (the config digest, hex).
func (p *Provider) dockerImageID(ctx context.Context, ref string) (string, error) {
	cli, err := p.dockerClient()
	if err != nil {
		return "", err
	}
	img, err := imagefs.Inspect(ctx, cli, p.dockerd, ref,
		"the oci provider unpacks Docker images, or OCI layouts named "+LayoutPrefix+"/dir",
		"start it, or name an OCI layout")
	return img.ID, err
}

// savedImage exports the image through the Engine API (docker save) into a file that
// go-containerregistry reads as a tarball image; the returned func removes the file.
func (p *Provider) savedImage(ctx context.Context, ref, id string) (v1.Image, func(), error) {
	cli, err := p.dockerClient()
	if err != nil {
		return nil, nil, err
	}
	f, err := os.CreateTemp(p.imagesDir(), ".save-")
	if err != nil {
		return nil, nil, err
	}
	drop := func() { f.Close(); os.Remove(f.Name()) }
	rc, err := cli.ImageSave(ctx, []string{"sha256:" + id})
	if err == nil {
		_, err = io.Copy(f, rc)
		rc.Close()
	}
	if err != nil {
		drop()
		return nil, nil, fmt.Errorf("exporting image %s from the Docker engine: %w", ref, err)
	}
	img, err := tarball.Image(func() (io.ReadCloser, error) { return os.Open(f.Name()) }, nil)
	if err != nil {
		drop()
		return nil, nil, fmt.Errorf("reading image %s as exported by the Docker engine: %w", ref, err)
	}
	return img, drop, nil
}

// layoutImage returns the image of an OCI image layout: dir, or dir@digest (layout.go).
func (p *Provider) layoutImage(ctx context.Context, spec string) (imageRoot, error) {
	dir, digest, _ := strings.Cut(spec, "@")
	root, err := p.openLayout(dir)
	if err != nil {
		return imageRoot{}, fmt.Errorf("%w: %s%s: %v", roche.ErrImageNotFound, LayoutPrefix, dir, err)
	}
	defer root.Close()
	img, err := readLayout(root, digest)
	if err != nil {
		return imageRoot{}, fmt.Errorf("%w: %s%s: %v", roche.ErrImageNotFound, LayoutPrefix, dir, err)
	}
	return p.cached(ctx, img.id, func() (v1.Image, func(), error) { return img, func() {}, nil })
}

// cached returns the cache's unpacked root of image id, unpacking open's image when it
// is not there yet; one process unpacks an image at a time, the others wait for it.
func (p *Provider) cached(ctx context.Context, id string, open func() (v1.Image, func(), error)) (imageRoot, error) {
	entry := filepath.Join(p.imagesDir(), id)
	if root, err := readRoot(entry); err == nil {
		// Marks the entry used, for pruneImages.
		now := time.Now()
		_ = os.Chtimes(filepath.Join(entry, "image.json"), now, now)
		return root, nil
	}
	if err := os.MkdirAll(p.imagesDir(), 0o700); err != nil {
		return imageRoot{}, fmt.Errorf("%w: making the image cache: %v", roche.ErrUnavailable, err)
	}
	unlock, err := lockPath(ctx, p.imagesDir())
	if err != nil {
		return imageRoot{}, err
	}
	defer unlock()
	if root, err := readRoot(entry); err == nil {
		return root, nil
	}
	start := time.Now()
	img, drop, err := open()
	if err != nil {
		return imageRoot{}, err
	}
	defer drop()
	if err := unpack(img, id, entry); err != nil {
		return imageRoot{}, err
	}
	p.log.Info("unpacked image", "id", id, "dir", entry, "took", time.Since(start).Round(time.Millisecond))
	return readRoot(entry)
}

// unpack writes img's flattened filesystem (go-containerregistry applies the layers and
// their whiteouts) and its meta file under entry, through a temporary directory renamed
// into place, so that a half-unpacked image is never used.
func unpack(img v1.Image, id, entry string) error {
	tmp, err := os.MkdirTemp(filepath.Dir(entry), ".unpack-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	tree := filepath.Join(tmp, "rootfs")
	if err := os.Mkdir(tree, 0o755); err != nil {
		return err
	}
	rc := mutate.Extract(img)
	_, err = imagefs.Unpack(rc, tree, false)
	rc.Close()
	if err != nil {
		return fmt.Errorf("unpacking image %s: %w", id, err)
	}
	// A layout's layers are checked as they are read: only now is all of each read.
	if c, ok := img.(interface{ check() error }); ok {
		if err := c.check(); err != nil {
			return fmt.Errorf("%w: unpacking image %s: %v", roche.ErrImageNotFound, id, err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("reading the config of image %s: %w", id, err)
	}
	root := imageRoot{ID: id, Env: cf.Config.Env, Workdir: cf.Config.WorkingDir}
	b, _ := json.Marshal(root)
	if err := os.WriteFile(filepath.Join(tmp, "image.json"), b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, entry)
}

// imageKeep is how long an unpacked image no sandbox uses stays in the cache after its
// last use.
const imageKeep = time.Hour

// pruneImages removes from the cache the unpacked images that no sandbox on record uses
// and no create used for imageKeep (an image tagged anew leaves its old tree behind).
func (p *Provider) pruneImages(ctx context.Context, inUse map[string]bool) error {
	entries, err := os.ReadDir(p.imagesDir())
	if err != nil {
		return nil
	}
	unlock, err := lockPath(ctx, p.imagesDir())
	if err != nil {
		return err
	}
	defer unlock()
	var errs []error
	for _, e := range entries {
		if !isHex(e.Name()) || inUse[e.Name()] {
			continue
		}
		fi, err := os.Stat(filepath.Join(p.imagesDir(), e.Name(), "image.json"))
		if err == nil && time.Since(fi.ModTime()) < imageKeep {
			continue
		}
		p.log.Info("removing an unused unpacked image", "id", e.Name())
		errs = append(errs, os.RemoveAll(filepath.Join(p.imagesDir(), e.Name())))
	}
	return errors.Join(errs...)
}

func readRoot(entry string) (imageRoot, error) {
	b, err := os.ReadFile(filepath.Join(entry, "image.json"))
	if err != nil {
		return imageRoot{}, err
	}
	var root imageRoot
	if err := json.Unmarshal(b, &root); err != nil {
		return imageRoot{}, fmt.Errorf("reading the image cache entry %s: %w", entry, err)
	}
	root.dir = filepath.Join(entry, "rootfs")
	return root, nil
}

// The ref index: which image id a Docker image name was unpacked as, for when the engine
// does not answer.

func (p *Provider) refFile(ref string) string {
	sum := sha256.Sum256([]byte(ref))
	return filepath.Join(p.imagesDir(), "refs", hex.EncodeToString(sum[:8]))
}

func (p *Provider) rememberRef(ref, id string) {
	f := p.refFile(ref)
	if b, err := os.ReadFile(f); err == nil && string(b) == id {
		return
	}
	if err := os.MkdirAll(filepath.Dir(f), 0o700); err == nil {
		_ = os.WriteFile(f, []byte(id), 0o600)
	}
}

func (p *Provider) knownRef(ref string) (imageRoot, bool) {
	b, err := os.ReadFile(p.refFile(ref))
	if err != nil || !isHex(string(b)) {
		return imageRoot{}, false
	}
	root, err := readRoot(filepath.Join(p.imagesDir(), string(b)))
	return root, err == nil
}

func (p *Provider) imagesDir() string { return filepath.Join(p.dataDir, "images") }

func isHex(s string) bool {
	if s == "" {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}
