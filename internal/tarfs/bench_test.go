//go:build unix

package tarfs

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// benchDir is where the extraction benchmarks write: a tmpfs when the host has one at
// /dev/shm, so that the extractor is measured rather than a disk.
func benchDir(b *testing.B) string {
	b.Helper()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		dir, err := os.MkdirTemp("/dev/shm", "tarfs-bench-")
		if err == nil {
			b.Cleanup(func() { os.RemoveAll(dir) })
			return dir
		}
	}
	return b.TempDir()
}

// benchArchive is a copy's stream: a root directory holding dirs directories of files
// files of size random bytes each.
func benchArchive(b *testing.B, dirs, files, size int) []byte {
	b.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	data := make([]byte, size)
	rand.Read(data)
	tw.WriteHeader(&tar.Header{Name: "r/", Typeflag: tar.TypeDir, Mode: 0o755})
	for d := range dirs {
		tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("r/d%d/", d), Typeflag: tar.TypeDir, Mode: 0o755})
		for f := range files {
			tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("r/d%d/f%d", d, f), Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(size)})
			tw.Write(data)
		}
	}
	tw.Close()
	return buf.Bytes()
}

// BenchmarkExtractTree copies in a tree of 2,000 files of 4 KiB (what a copy costs per
// entry); BenchmarkExtractLarge one file of 100 MiB (per byte).
func BenchmarkExtractTree(b *testing.B)  { benchExtract(b, benchArchive(b, 20, 100, 4096)) }
func BenchmarkExtractLarge(b *testing.B) { benchExtract(b, benchArchive(b, 1, 1, 100<<20)) }

func benchExtract(b *testing.B, archive []byte) {
	dir := benchDir(b)
	b.SetBytes(int64(len(archive)))
	b.ResetTimer()
	for i := range b.N {
		dst := filepath.Join(dir, strconv.Itoa(i))
		if _, err := Extract(bytes.NewReader(archive), dst, Options{}); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		os.RemoveAll(dst)
		b.StartTimer()
	}
}
