package oci

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestSealBinary: the copy runs, carries exactly the seals runc and crun look for to
// skip copying themselves, and cannot be written, grown or shrunk, through its
// descriptor or through /proc (as a container would try, CVE-2019-5736).
func TestSealBinary(t *testing.T) {
	f, err := sealBinary("/bin/echo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE; seals != want {
		t.Fatalf("seals %#x, want %#x", seals, want)
	}
	path := fmt.Sprintf("/proc/self/fd/%d", f.Fd())
	out, err := exec.Command(path, "sealed").Output()
	if err != nil || string(out) != "sealed\n" {
		t.Fatalf("running the copy: %q %v", out, err)
	}
	if _, err := f.WriteAt([]byte("x"), 0); err == nil {
		t.Fatal("wrote into the sealed copy through its descriptor")
	}
	if w, err := os.OpenFile(path, os.O_WRONLY, 0); err == nil {
		_, werr := w.Write([]byte("x"))
		w.Close()
		if werr == nil {
			t.Fatal("wrote into the sealed copy through /proc")
		}
	}
	if err := unix.Ftruncate(int(f.Fd()), 0); err == nil {
		t.Fatal("truncated the sealed copy")
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, 0); err == nil {
		// F_SEAL_SEAL: no seal can be added (or taken) any more; adding none still fails.
		t.Fatal("the seals are not sealed")
	}
}

// TestCloseSealedDuringRuns: the provider's Close closes the sealed copy while lease
// teardowns may still run the runtime. Every run, before, during and after, must run
// the binary (the copy while it is open, the file after), never a closed or reused
// descriptor. Run under -race (make test does), it also checks that closing and
// starting share no unguarded field.
func TestCloseSealedDuringRuns(t *testing.T) {
	f, err := sealBinary("/bin/echo")
	if err != nil {
		t.Fatal(err)
	}
	r := &ociRuntime{name: "echo", path: "/bin/echo", root: "/nowhere", sealed: f}
	const runners, runs = 4, 25
	errs := make(chan error, runners*runs)
	var wg sync.WaitGroup
	for i := 0; i < runners; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < runs; j++ {
				out, err := r.command(context.Background(), "state", "x").Output()
				if err != nil || string(out) != "--root /nowhere state x\n" {
					errs <- fmt.Errorf("run %d: %q %v", j, out, err)
				}
				// Descriptors opened meanwhile may take the copy's number once it is
				// closed; a run must not then execute whatever they are.
				if g, err := os.Open("/dev/null"); err == nil {
					defer g.Close()
				}
			}
		}()
	}
	time.Sleep(20 * time.Millisecond)
	r.closeSealed()
	r.closeSealed() // idempotent
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if r.sealed != nil {
		t.Fatal("the sealed copy is still set after closeSealed")
	}
}
