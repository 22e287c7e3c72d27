package oci

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestDrawUIDSeesEveryRecord: a drawn uid is never one a live sandbox's record holds,
// including records another process wrote after this provider last drew (its memo of
// the records read must not hide them), and a uid comes free when its sandbox's
// directory is gone. The range holds four uids, three taken each time, so a draw that
// missed a record would collide within the 64 tries.
func TestDrawUIDSeesEveryRecord(t *testing.T) {
	dir := t.TempDir()
	p, err := New(WithStateDir(dir), WithDataDir(t.TempDir()), WithUIDRange(100000, 4))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	put := func(n, uid int) string {
		t.Helper()
		id := fmt.Sprintf("%s-%016x", Name, n)
		if err := os.Mkdir(filepath.Join(dir, id), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := writeRecord(filepath.Join(dir, id), record{ID: id, UID: uid}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	draw := func() int {
		t.Helper()
		uid, unlock, err := p.drawUID(context.Background(), "")
		if err != nil {
			t.Fatal(err)
		}
		unlock()
		return uid
	}
	put(1, 100000)
	second := put(2, 100001)
	put(3, 100002)
	put(4, -1) // a sandbox run as the caller's user takes none
	for range 20 {
		if uid := draw(); uid != 100003 {
			t.Fatalf("drew %d with 100000-100002 taken, want 100003", uid)
		}
	}
	// Another process frees one and takes the last.
	if err := os.RemoveAll(filepath.Join(dir, second)); err != nil {
		t.Fatal(err)
	}
	put(5, 100003)
	for range 20 {
		if uid := draw(); uid != 100001 {
			t.Fatalf("drew %d after 100001 came free and 100003 was taken, want 100001", uid)
		}
	}
}
