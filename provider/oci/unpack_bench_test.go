//go:build linux

package oci

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/internal/engine"
	"github.com/roche-sandbox/roche/provider/internal/imagefs"
)

// savedTestImage exports the test image (docker save) into a file of the benchmark's
// own and returns it as an image, with its id.
func savedTestImage(b *testing.B) (v1.Image, string) {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Fatal("unpacking an image keeps its owners, which needs root (the README's test command runs as root)")
	}
	cli, err := engine.DockerClient()
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	ins, err := cli.ImageInspect(ctx, testenv.Image())
	if err != nil {
		b.Fatal(err)
	}
	file := filepath.Join(b.TempDir(), "image.tar")
	f, err := os.Create(file)
	if err != nil {
		b.Fatal(err)
	}
	rc, err := cli.ImageSave(ctx, []string{ins.ID})
	if err == nil {
		_, err = io.Copy(f, rc)
		rc.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		b.Fatal(err)
	}
	img, err := tarball.ImageFromPath(file, nil)
	if err != nil {
		b.Fatal(err)
	}
	return img, strings.TrimPrefix(ins.ID, "sha256:")
}

// BenchmarkUnpack unpacks the test image as a create does the first time: layers read
// from a docker save, flattened, written out with owners and modes.
func BenchmarkUnpack(b *testing.B) {
	img, id := savedTestImage(b)
	dir := memDir(b)
	b.ResetTimer()
	for i := range b.N {
		entry := filepath.Join(dir, strconv.Itoa(i))
		if err := unpack(img, id, entry); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		os.RemoveAll(entry)
		b.StartTimer()
	}
}

// BenchmarkExtractImage is BenchmarkUnpack's extraction alone: the flattened stream is
// read from a file made once.
func BenchmarkExtractImage(b *testing.B) {
	img, _ := savedTestImage(b)
	flat := filepath.Join(b.TempDir(), "flat.tar")
	f, err := os.Create(flat)
	if err != nil {
		b.Fatal(err)
	}
	rc := mutate.Extract(img)
	n, err := io.Copy(f, rc)
	rc.Close()
	f.Close()
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(n)
	dir := memDir(b)
	b.ResetTimer()
	for i := range b.N {
		tree := filepath.Join(dir, strconv.Itoa(i))
		b.StopTimer()
		os.Mkdir(tree, 0o755)
		in, err := os.Open(flat)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		_, err = imagefs.Unpack(in, tree, false)
		in.Close()
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		os.RemoveAll(tree)
		b.StartTimer()
	}
}

// memDir is a tmpfs of the benchmark's own: what is measured is the extractor, not a
// disk that other work on the machine keeps busy.
func memDir(b *testing.B) string {
	b.Helper()
	dir := b.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=4g,mode=0700"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}
