//go:build linux

package vm

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/docker/docker/api/types/container"
	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/internal/engine"
	"github.com/roche-sandbox/roche/provider/internal/imagefs"
)

// BenchmarkExtractRootfs unpacks the test image's export (made once, as buildRootfs makes
// it: a container created, never started) as a VM's root filesystem is built, before
// mkfs.ext4 packs it.
func BenchmarkExtractRootfs(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Fatal("a root filesystem keeps its owners and device nodes, which needs root (the README's test command runs as root)")
	}
	cli, err := engine.DockerClient()
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	created, err := cli.ContainerCreate(ctx, &container.Config{Image: testenv.Image(), Entrypoint: []string{"/.roche-rootfs-export"},
		Labels: map[string]string{"roche.rootfs-export": "true"}}, &container.HostConfig{NetworkMode: "none"}, nil, nil, "")
	if err != nil {
		b.Fatal(err)
	}
	defer cli.ContainerRemove(context.WithoutCancel(ctx), created.ID, container.RemoveOptions{Force: true})
	export := filepath.Join(b.TempDir(), "export.tar")
	f, err := os.Create(export)
	if err != nil {
		b.Fatal(err)
	}
	rc, err := cli.ContainerExport(ctx, created.ID)
	var n int64
	if err == nil {
		n, err = io.Copy(f, rc)
		rc.Close()
	}
	f.Close()
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(n)
	dir := memDir(b)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		tree := filepath.Join(dir, strconv.Itoa(i))
		os.Mkdir(tree, 0o755)
		in, err := os.Open(export)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		_, err = imagefs.Unpack(in, tree, true)
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
