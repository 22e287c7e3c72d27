package providertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
)

// The copy boundary, attacked the way an outside audit did: from inside the sandbox
// (symlinks, a 10 TiB sparse file, a race in a shared directory) and from the host (links
// planted at the destination). Each attack aims at a victim directory the check makes and
// fails if anything lands in it or leaves it.

const victimContent = "victim: must never change or leave the host"

// VictimDir makes a directory holding one file, for an attack to aim at: CheckVictim
// fails the test if anything landed in it or left it.
func VictimDir(t *testing.T) string {
	t.Helper()
	v := t.TempDir()
	if err := os.WriteFile(filepath.Join(v, "keep"), []byte(victimContent), 0o600); err != nil {
		t.Fatal(err)
	}
	return v
}

// CheckVictim fails the test if the victim directory v changed.
func CheckVictim(t *testing.T, v string) {
	t.Helper()
	entries, err := os.ReadDir(v)
	if err != nil || len(entries) != 1 {
		t.Fatalf("the victim directory changed: %v %v", entries, err)
	}
	if b, _ := os.ReadFile(filepath.Join(v, "keep")); string(b) != victimContent {
		t.Fatalf("the victim file changed: %q", b)
	}
}

func (s *suite) tarCopier(t *testing.T) roche.TarCopier {
	t.Helper()
	tc, ok := s.p.(roche.TarCopier)
	if !ok {
		t.Fatalf("the %s provider copies files but does not implement roche.TarCopier", s.p.Name())
	}
	return tc
}

// canLink reports whether code in the sandbox can make a symlink at link (to target),
// and if not, why.
func (s *suite) canLink(t *testing.T, id, target, link string) (bool, string) {
	out := s.pyOK(t, id, fmt.Sprintf(`
import os
try:
    os.symlink(%q, %q); print('linked')
except OSError as e:
    print(e)`, target, link))
	return out == "linked", out
}

// testCopyOutBoundary: copying out never writes outside the destination.
func (s *suite) testCopyOutBoundary(t *testing.T) {
	tc := s.tarCopier(t)
	id := s.create(t, s.opts.Config)
	ctx := ctxFor(t, 3*time.Minute)
	v := VictimDir(t)
	dst := filepath.Join(t.TempDir(), "e")
	linked, why := s.canLink(t, id, v, "/tmp/e")
	if linked {
		// The audit's first step: /tmp/e -> the victim, copied out.
		for _, preserve := range []bool{false, true} {
			rep, err := roche.CopyOut(ctx, tc, id, "/tmp/e", dst, roche.CopyOptions{PreserveLinks: preserve})
			if err != nil {
				t.Fatalf("copying out a symlink (preserve %v): %v", preserve, err)
			}
			if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("copying out a symlink to the victim made something on the host (preserve %v): %v", preserve, err)
			}
			if rep.SkippedLinks != 1 || !strings.Contains(rep.Note(), "skipped 1 symlink (/tmp/e -> "+v+")") {
				t.Fatalf("the report does not say the link was left out: %+v %q", rep, rep.Note())
			}
		}
		s.pyOK(t, id, "import os; os.remove('/tmp/e')")
	} else {
		t.Logf("the sandbox cannot make symlinks (%s): the attack below uses links planted on the host", why)
	}
	// The second step: /tmp/e is a directory now, copied onto a host symlink to the victim.
	s.pyOK(t, id, `
import os
os.makedirs('/tmp/e/cron.d')
open('/tmp/e/cron.d/p', 'w').write('pwned')
open('/tmp/e/keep', 'w').write('pwned')
os.makedirs('/tmp/out/sub')
open('/tmp/out/sub/keep', 'w').write('pwned')
open('/tmp/out/f', 'w').write('pwned')`)
	if err := os.Symlink(v, dst); err != nil {
		t.Fatal(err)
	}
	if _, err := roche.CopyOut(ctx, tc, id, "/tmp/e", dst, roche.CopyOptions{}); err != nil {
		t.Fatalf("copying a directory out onto a host symlink: %v", err)
	}
	CheckVictim(t, v)
	if b, _ := os.ReadFile(filepath.Join(dst, "cron.d", "p")); string(b) != "pwned" {
		t.Fatalf("the copy did not land in the destination: %q", b)
	}
	// Links planted below the destination, to the victim directory and its file.
	out := filepath.Join(t.TempDir(), "out")
	os.MkdirAll(out, 0o755)
	os.Symlink(v, filepath.Join(out, "sub"))
	os.Symlink(filepath.Join(v, "keep"), filepath.Join(out, "f"))
	if _, err := roche.CopyOut(ctx, tc, id, "/tmp/out", out, roche.CopyOptions{PreserveLinks: true}); err != nil {
		t.Fatalf("copying out onto planted links: %v", err)
	}
	CheckVictim(t, v)

	if !linked {
		return
	}
	// PreserveLinks keeps a link pointing inside and leaves out those pointing elsewhere.
	s.pyOK(t, id, `
import os
os.makedirs('/tmp/t/a')
open('/tmp/t/f', 'w').write('hi')
os.symlink('../f', '/tmp/t/a/in')
os.symlink('../../etc', '/tmp/t/out')
os.symlink('/etc/passwd', '/tmp/t/abs')`)
	kept := filepath.Join(t.TempDir(), "t")
	rep, err := roche.CopyOut(ctx, tc, id, "/tmp/t", kept, roche.CopyOptions{PreserveLinks: true})
	if err != nil || rep.Links != 1 || rep.SkippedLinks != 2 {
		t.Fatalf("copying links out with PreserveLinks: %+v %v", rep, err)
	}
	if l, err := os.Readlink(filepath.Join(kept, "a", "in")); err != nil || l != "../f" {
		t.Fatalf("the inside link: %q %v", l, err)
	}
	for _, gone := range []string{"out", "abs"} {
		if _, err := os.Lstat(filepath.Join(kept, gone)); err == nil {
			t.Fatalf("the link %s pointing outside was made", gone)
		}
	}
}

// testCopyCapAndHoles: a copy moves at most its cap, refused before the file that passes
// it is written, and a sparse file keeps its holes on the host.
func (s *suite) testCopyCapAndHoles(t *testing.T) {
	tc := s.tarCopier(t)
	id := s.create(t, s.opts.Config)
	ctx := ctxFor(t, 3*time.Minute)
	dir := t.TempDir()
	s.pyOK(t, id, `
import os
open('/tmp/two', 'wb').write(os.urandom(2 << 20))
f = open('/tmp/sp', 'wb'); f.seek(16 << 20); f.write(b'd' * 4096); f.truncate(32 << 20); f.close()`)
	dst := filepath.Join(dir, "two")
	_, err := roche.CopyOut(ctx, tc, id, "/tmp/two", dst, roche.CopyOptions{MaxBytes: 1 << 20})
	if !errors.Is(err, roche.ErrExhausted) || !strings.Contains(err.Error(), "limit of 1 MiB") {
		t.Fatalf("copying 2 MiB out with a 1 MiB cap: %v, want ErrExhausted naming the cap", err)
	}
	if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the file over the cap was written: %v", err)
	}
	if _, err := roche.CopyOut(ctx, tc, id, "/tmp/two", dst, roche.CopyOptions{MaxBytes: 2 << 20}); err != nil {
		t.Fatalf("copying 2 MiB out with a 2 MiB cap: %v", err)
	}
	big := filepath.Join(dir, "three")
	os.WriteFile(big, make([]byte, 3<<20), 0o644)
	if _, err := roche.CopyIn(ctx, tc, id, big, "/tmp/three", roche.CopyOptions{MaxBytes: 2 << 20}); !errors.Is(err, roche.ErrExhausted) {
		t.Fatalf("copying 3 MiB in with a 2 MiB cap: %v, want ErrExhausted", err)
	}

	sp := filepath.Join(dir, "sp")
	if _, err := roche.CopyOut(ctx, tc, id, "/tmp/sp", sp, roche.CopyOptions{}); err != nil {
		t.Fatalf("copying a sparse file out: %v", err)
	}
	fi, err := os.Stat(sp)
	if err != nil || fi.Size() != 32<<20 {
		t.Fatalf("sparse file copied as %v %v", fi, err)
	}
	if used := fi.Sys().(*syscall.Stat_t).Blocks * 512; used > 1<<20 {
		t.Fatalf("the 32 MiB file with 4 KiB of data takes %d bytes on the host", used)
	}
	f, _ := os.Open(sp)
	got := make([]byte, 4096)
	f.ReadAt(got, 16<<20)
	f.Close()
	if !bytes.Equal(got, bytes.Repeat([]byte("d"), 4096)) {
		t.Fatal("the sparse file's data was lost")
	}

	if !s.caps.Processes {
		return // a 10 TiB sparse file needs a Linux file system (a WASI guest's are quota-bound)
	}
	s.pyOK(t, id, "open('/tmp/huge', 'wb').truncate(10 << 40)")
	huge := filepath.Join(dir, "huge")
	_, err = roche.CopyOut(ctx, tc, id, "/tmp/huge", huge, roche.CopyOptions{})
	for _, want := range []string{"/tmp/huge is 10 TiB", "limit of 1 GiB"} {
		if !errors.Is(err, roche.ErrExhausted) || !strings.Contains(err.Error(), want) {
			t.Fatalf("copying a 10 TiB sparse file out: %v, want ErrExhausted saying %q", err, want)
		}
	}
	if _, err := os.Lstat(huge); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the 10 TiB file was written: %v", err)
	}
}

// SwapLoop is a Python program that swaps /shared/f between a file and a symlink to
// argv[1] until /shared/stop exists (or two minutes pass), holding each state for a
// moment so that copies racing it see both (a file would otherwise be there only while
// the next link is made). Copy-in race tests run it in a sandbox with /shared mounted.
const SwapLoop = `
import os, sys, time
d, victim = '/shared', sys.argv[1]
end = time.time() + 120
while time.time() < end and not os.path.exists(d + '/stop'):
    open(d + '/.f', 'w').write('plain'); os.rename(d + '/.f', d + '/f'); time.sleep(0.001)
    os.symlink(victim, d + '/.l'); os.rename(d + '/.l', d + '/f'); time.sleep(0.001)
`

// CopyInRace runs the copy-in race below on its own, for suites other than this one
// (the escape suite): p must copy files and take host mounts.
func CopyInRace(t *testing.T, p roche.Provider, opts Options) {
	if opts.Python == nil {
		opts.Python = []string{"python3"}
	}
	s := &suite{p: p, opts: opts, caps: p.Capabilities()}
	s.testCopyInRace(t)
}

// testCopyInRace: with a read-write mount, the sandbox swaps a file and a symlink to a
// root-only host file in a loop while the host copies the mount in, again and again; the
// host file's content must never reach the sandbox.
func (s *suite) testCopyInRace(t *testing.T) {
	const rounds = 80
	tc := s.tarCopier(t)
	shared := t.TempDir()
	os.Chmod(shared, 0o777) // the sandbox user writes there
	b := make([]byte, 12)
	rand.Read(b)
	secretContent := "root-only-" + hex.EncodeToString(b)
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte(secretContent), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := s.opts.Config
	cfg.Mounts = []roche.Mount{{Source: shared, Target: "/shared", ReadWrite: true}}
	id := s.create(t, cfg)
	if linked, why := s.canLink(t, id, secret, "/shared/probe"); !linked {
		t.Skipf("the sandbox cannot make symlinks (%s), so it cannot race a copy with one", why)
	}
	os.Remove(filepath.Join(shared, "probe"))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		req := roche.ExecRequest{Cmd: append(append([]string{}, s.opts.Python...), "-c", SwapLoop, secret), Timeout: 150 * time.Second}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		s.p.Exec(ctx, id, req)
	}()
	stop := func() {
		os.WriteFile(filepath.Join(shared, "stop"), nil, 0o644)
		wg.Wait()
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, err := os.Lstat(filepath.Join(shared, "f")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatal("the swapping loop did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	ctx := ctxFor(t, 10*time.Minute)
	failed := 0
	for i := range rounds {
		if _, err := roche.CopyIn(ctx, tc, id, shared, fmt.Sprintf("/tmp/got/%d", i), roche.CopyOptions{}); err != nil {
			failed++ // "kept changing" is a refusal, which is fine; a leak is not
			t.Logf("round %d: %v", i, err)
		}
	}
	stop()
	got := s.pyOK(t, id, fmt.Sprintf(`
import os
found, links, files = [], 0, 0
for root, dirs, names in os.walk('/tmp/got'):
    for n in names:
        p = os.path.join(root, n)
        if os.path.islink(p):
            links += n == 'f'
            continue
        files += n == 'f'
        if %q in open(p, errors='replace').read():
            found.append(p)
print(found, links, files)`, secretContent))
	fields := strings.Fields(got)
	if !strings.HasPrefix(got, "[]") {
		t.Fatalf("the root-only host file reached the sandbox: %s", got)
	}
	if failed > rounds/4 {
		t.Fatalf("%d of %d copies failed", failed, rounds)
	}
	if len(fields) != 3 || fields[1] == "0" || fields[2] == "0" {
		t.Fatalf("the race was not live (symlinks and files copied): %s", got)
	}
	t.Logf("%d rounds: %s copied as the symlink, %s as the file, none as the host file", rounds, fields[1], fields[2])
}

// fillTmp fills /tmp to its last block and says "full".
const fillTmp = `
import errno, os
fd = os.open('/tmp/fill', os.O_WRONLY | os.O_CREAT)
for size in (1 << 20, 4096, 1):
    try:
        while True:
            os.write(fd, os.urandom(size))
    except OSError as e:
        assert e.errno == errno.ENOSPC, e
print('full')`

// testCopyNoSpace: copying into, or writing, a full /tmp is ErrExhausted saying no
// space, not a permission error.
func (s *suite) testCopyNoSpace(t *testing.T) {
	tc := s.tarCopier(t)
	id := s.create(t, s.opts.Config)
	if got := s.pyOK(t, id, fillTmp); got != "full" {
		t.Fatalf("filling /tmp: %q", got)
	}
	ctx := ctxFor(t, 2*time.Minute)
	blob := make([]byte, 2<<20)
	rand.Read(blob) // zeros would become holes and need no space
	src := filepath.Join(t.TempDir(), "blob")
	os.WriteFile(src, blob, 0o644)
	_, err := roche.CopyIn(ctx, tc, id, src, "/tmp/blob", roche.CopyOptions{})
	if !errors.Is(err, roche.ErrExhausted) || errors.Is(err, roche.ErrPermission) || !strings.Contains(err.Error(), "no space") {
		t.Fatalf("copying into a full /tmp: %v, want ErrExhausted saying no space", err)
	}
	if fs, ok := s.p.(roche.FileSystem); ok {
		err := fs.WriteFile(ctx, id, "/tmp/more", bytes.NewReader(blob), 0o644)
		if errors.Is(err, roche.ErrUnsupported) {
			return // this sandbox has no files API (Docker's exec fallback)
		}
		if !errors.Is(err, roche.ErrExhausted) || errors.Is(err, roche.ErrPermission) || !strings.Contains(err.Error(), "no space") {
			t.Fatalf("WriteFile into a full /tmp: %v, want ErrExhausted saying no space", err)
		}
	}
}
