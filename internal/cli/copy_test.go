package cli

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/providertest"
)

// The copy boundary attacked through the real binaries: roche in direct mode, and roche
// through a real roched. Each attack aims at a victim directory the test makes, and
// fails if anything lands in it or leaves it.

// rocheBin runs the roche binary with global flags (--direct, or --socket).
type rocheBin struct {
	path   string
	global []string
}

func (r rocheBin) run(t *testing.T, args ...string) result {
	t.Helper()
	cmd := exec.Command(r.path, append(append([]string{}, r.global...), args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	code := 0
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running %s: %v", r.path, err)
	}
	return result{code, out.String(), errb.String()}
}

func (r rocheBin) ok(t *testing.T, args ...string) string {
	t.Helper()
	res := r.run(t, args...)
	if res.code != 0 {
		t.Fatalf("roche %s: exit %d: %s", strings.Join(args, " "), res.code, res.stderr)
	}
	return res.stdout
}

// sandbox creates a sandbox with the binary, destroyed at the end of the test.
func (r rocheBin) sandbox(t *testing.T, flags ...string) string {
	t.Helper()
	id := strings.TrimSpace(r.ok(t, append([]string{"create", "--image", testImage()}, flags...)...))
	t.Cleanup(func() { r.run(t, "destroy", id) })
	return id
}

// buildBinaries builds roche and roched from this checkout for the test.
func buildBinaries(t *testing.T) (roche, roched string) {
	t.Helper()
	roche, roched, err := testenv.BuildCLI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return roche, roched
}

// startRoched runs the real roched binary on a socket of its own until the test ends.
func startRoched(t *testing.T, roched string) string {
	t.Helper()
	socket := filepath.Join(socketDir(t), "roched.sock")
	cmd := exec.Command(roched, "--socket", socket, "--log-level", "info")
	var log testenv.SyncBuffer // written by the command's copying goroutines
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(60 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Errorf("roched did not stop on SIGTERM:\n%s", log.String())
		}
	})
	if !log.Await(t, "roched listening", exited, 60*time.Second) {
		t.Fatalf("roched exited: %s", log.String())
	}
	return socket
}

// modes are the two ways the CLI copies: in-process, and through roched.
func modes(t *testing.T) map[string]rocheBin {
	roche, roched := buildBinaries(t)
	socket := startRoched(t, roched)
	return map[string]rocheBin{
		"direct": {path: roche, global: []string{"--direct"}},
		"daemon": {path: roche, global: []string{"--socket", socket}},
	}
}

// TestCopyOutBoundary: the audit's attacks on copying out, through the CLI binary in
// direct mode and through roched.
func TestCopyOutBoundary(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	for name, r := range modes(t) {
		t.Run(name, func(t *testing.T) {
			id := r.sandbox(t)
			t.Run("SymlinkSwapAttack", func(t *testing.T) { testSymlinkSwap(t, r, id) })
			t.Run("PlantedLinkBelowDestination", func(t *testing.T) { testPlantedBelow(t, r, id) })
			t.Run("PreserveLinks", func(t *testing.T) { testPreserveLinks(t, r, id) })
			t.Run("HugeSparseFileRefused", func(t *testing.T) { testHugeSparse(t, r, id) })
			t.Run("SparseFileKeepsHoles", func(t *testing.T) { testSparseKept(t, r, id) })
		})
	}
}

// testSymlinkSwap: in the sandbox /tmp/e -> victim; copied out; then /tmp/e becomes a
// directory holding cron.d/p and is copied out again, onto a host symlink to the victim.
func testSymlinkSwap(t *testing.T, r rocheBin, id string) {
	v := providertest.VictimDir(t)
	dst := filepath.Join(t.TempDir(), "e")
	r.ok(t, "exec", "--sandbox", id, "--", "ln", "-s", v, "/tmp/e")
	for _, flags := range [][]string{nil, {"--preserve-links"}} {
		res := r.run(t, append(append([]string{"cp"}, flags...), id+":/tmp/e", dst)...)
		if res.code != 0 {
			t.Fatalf("cp %v of a symlink: %+v", flags, res)
		}
		if !strings.Contains(res.stderr, "roche: skipped 1 symlink (/tmp/e -> "+v+")") || !strings.Contains(res.stderr, "--preserve-links") {
			t.Fatalf("cp %v said nothing of the symlink it left out: %q", flags, res.stderr)
		}
		if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("cp %v made something at the destination: %v", flags, err)
		}
	}
	r.ok(t, "exec", "--sandbox", id, "--", "sh", "-c", "rm /tmp/e && mkdir -p /tmp/e/cron.d && echo pwned > /tmp/e/cron.d/p && echo pwned > /tmp/e/keep")
	if err := os.Symlink(v, dst); err != nil { // as the first copy once made it
		t.Fatal(err)
	}
	r.ok(t, "cp", id+":/tmp/e", dst)
	providertest.CheckVictim(t, v)
	if fi, err := os.Lstat(dst); err != nil || !fi.IsDir() {
		t.Fatalf("the destination is not the directory copied: %v %v", fi, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "cron.d", "p")); string(b) != "pwned\n" {
		t.Fatalf("the copy did not land in the destination: %q", b)
	}
}

func testPlantedBelow(t *testing.T, r rocheBin, id string) {
	v := providertest.VictimDir(t)
	host := t.TempDir()
	dst := filepath.Join(host, "out")
	os.MkdirAll(dst, 0o755)
	os.Symlink(v, filepath.Join(dst, "sub"))
	os.Symlink(filepath.Join(v, "keep"), filepath.Join(dst, "f"))
	r.ok(t, "exec", "--sandbox", id, "--", "sh", "-c", "mkdir -p /tmp/out/sub && echo pwned > /tmp/out/sub/keep && echo pwned > /tmp/out/f")
	// Into the directory that holds the planted links (host/out, as cp does), and onto it.
	r.ok(t, "cp", id+":/tmp/out", host)
	providertest.CheckVictim(t, v)
	r.ok(t, "cp", "-T", id+":/tmp/out", dst)
	providertest.CheckVictim(t, v)
	for _, p := range []string{"sub", "f"} {
		if fi, err := os.Lstat(filepath.Join(dst, p)); err != nil || fi.Mode()&os.ModeSymlink != 0 {
			t.Fatalf("%s is still a symlink: %v", p, err)
		}
	}
}

func testPreserveLinks(t *testing.T, r rocheBin, id string) {
	r.ok(t, "exec", "--sandbox", id, "--", "sh", "-c",
		"mkdir -p /tmp/t/a && echo hi > /tmp/t/f && ln -s ../f /tmp/t/a/in && ln -s ../../etc /tmp/t/out && ln -s /etc/passwd /tmp/t/abs")
	dir := t.TempDir()
	res := r.run(t, "cp", "--preserve-links", "--json", id+":/tmp/t", filepath.Join(dir, "kept"))
	var rep roche.CopyReport
	if err := json.Unmarshal([]byte(res.stdout), &rep); res.code != 0 || err != nil {
		t.Fatalf("cp --preserve-links --json: %+v (%v)", res, err)
	}
	if rep.Links != 1 || rep.SkippedLinks != 2 || rep.Files != 1 || !strings.Contains(res.stderr, "skipped 2 symlinks") {
		t.Fatalf("report %+v, stderr %q", rep, res.stderr)
	}
	if l, err := os.Readlink(filepath.Join(dir, "kept", "a", "in")); err != nil || l != "../f" {
		t.Fatalf("the inside link: %q %v", l, err)
	}
	for _, gone := range []string{"out", "abs"} {
		if _, err := os.Lstat(filepath.Join(dir, "kept", gone)); err == nil {
			t.Fatalf("the link %s pointing outside was made", gone)
		}
	}
	res = r.run(t, "cp", "--json", id+":/tmp/t", filepath.Join(dir, "plain"))
	if err := json.Unmarshal([]byte(res.stdout), &rep); res.code != 0 || err != nil || rep.Links != 0 || rep.SkippedLinks != 3 {
		t.Fatalf("cp without --preserve-links: %+v %+v", res, rep)
	}
}

func testHugeSparse(t *testing.T, r rocheBin, id string) {
	r.ok(t, "exec", "--sandbox", id, "--", "truncate", "-s", "10T", "/tmp/s")
	dst := filepath.Join(t.TempDir(), "s")
	res := r.run(t, "cp", id+":/tmp/s", dst)
	for _, want := range []string{"resource exhausted", "/tmp/s is 10 TiB", "limit of 1 GiB", "--max-bytes"} {
		if res.code == 0 || !strings.Contains(res.stderr, want) {
			t.Fatalf("copying out a 10 TiB file: %+v, want a refusal saying %q", res, want)
		}
	}
	if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the oversized file was written: %v", err)
	}
	// A cap of one's own.
	r.ok(t, "exec", "--sandbox", id, "--", "sh", "-c", "head -c 2097152 /dev/urandom > /tmp/two")
	if res := r.run(t, "cp", "--max-bytes", "1m", id+":/tmp/two", dst); res.code == 0 || !strings.Contains(res.stderr, "limit of 1 MiB") {
		t.Fatalf("--max-bytes 1m on 2 MiB: %+v", res)
	}
	r.ok(t, "cp", "--max-bytes", "2m", id+":/tmp/two", dst)
	src := filepath.Join(t.TempDir(), "up")
	os.WriteFile(src, make([]byte, 3<<20), 0o644)
	if res := r.run(t, "cp", "--max-bytes", "2m", src, id+":/tmp/up"); res.code == 0 || !strings.Contains(res.stderr, "limit of 2 MiB") {
		t.Fatalf("copying in past --max-bytes: %+v", res)
	}
}

func testSparseKept(t *testing.T, r rocheBin, id string) {
	r.ok(t, "exec", "--sandbox", id, "--", "python3", "-c",
		"f = open('/tmp/sp', 'wb'); f.seek(50 << 20); f.write(b'd' * 4096); f.truncate(100 << 20)")
	dst := filepath.Join(t.TempDir(), "sp")
	r.ok(t, "cp", id+":/tmp/sp", dst)
	fi, err := os.Stat(dst)
	if err != nil || fi.Size() != 100<<20 {
		t.Fatalf("copied %v %v", fi, err)
	}
	if used := fi.Sys().(*syscall.Stat_t).Blocks * 512; used > 1<<20 {
		t.Fatalf("the 100 MiB file with 4 KiB of data takes %d bytes on the host", used)
	}
	f, _ := os.Open(dst)
	defer f.Close()
	got := make([]byte, 4096)
	f.ReadAt(got, 50<<20)
	if !bytes.Equal(got, bytes.Repeat([]byte("d"), 4096)) {
		t.Fatal("the data block was lost")
	}
}

// fillTmp fills the sandbox's /tmp to its last block and says "full".
const fillTmp = `
import errno, os
fd = os.open('/tmp/fill', os.O_WRONLY | os.O_CREAT)
for size in (1 << 20, 4096, 1):
    try:
        while True:
            os.write(fd, os.urandom(size))
    except OSError as e:
        assert e.errno == errno.ENOSPC, e
print('full')
`

// TestCopyInNoSpace: copying into a full /tmp says no space, not permission denied.
func TestCopyInNoSpace(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	for name, r := range modes(t) {
		t.Run(name, func(t *testing.T) {
			id := r.sandbox(t)
			if out := r.ok(t, "exec", "--sandbox", id, "--", "python3", "-c", fillTmp); out != "full\n" {
				t.Fatalf("filling /tmp: %q", out)
			}
			src := filepath.Join(t.TempDir(), "blob")
			blob := make([]byte, 2<<20)
			rand.Read(blob) // zeros would become holes and need no space
			os.WriteFile(src, blob, 0o644)
			res := r.run(t, "cp", src, id+":/tmp/blob")
			if res.code == 0 || !strings.Contains(res.stderr, "resource exhausted") || !strings.Contains(res.stderr, "no space") ||
				strings.Contains(res.stderr, "permission denied") {
				t.Fatalf("cp into a full /tmp: %+v, want resource exhausted: no space", res)
			}
		})
	}
}

// swapLoop swaps /shared/f between a file and a symlink to argv[1] until /shared/stop
// exists (or two minutes pass).
// TestCopyInRace: with a read-write mount, sandboxed code swaps a file and a symlink to
// a root-only host file in a loop while the host copies the mount in again and again.
// The host file's content must never appear in the sandbox.
func TestCopyInRace(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	const rounds = 80
	for name, r := range modes(t) {
		t.Run(name, func(t *testing.T) {
			shared := t.TempDir()
			os.Chmod(shared, 0o777) // the sandbox user writes there
			b := make([]byte, 12)
			rand.Read(b)
			secretContent := "root-only-" + hex.EncodeToString(b)
			secret := filepath.Join(t.TempDir(), "secret")
			if err := os.WriteFile(secret, []byte(secretContent), 0o600); err != nil {
				t.Fatal(err)
			}
			id := r.sandbox(t, "--mount", shared+":/shared:rw")
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				r.run(t, "exec", "--sandbox", id, "--timeout", "150", "--", "python3", "-c", providertest.SwapLoop, secret)
			}()
			stop := func() {
				os.WriteFile(filepath.Join(shared, "stop"), nil, 0o644)
				wg.Wait()
			}
			deadline := time.Now().Add(60 * time.Second)
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
			failed := 0
			for i := range rounds {
				if res := r.run(t, "cp", shared, id+":/tmp/got/"+strconv.Itoa(i)); res.code != 0 {
					failed++ // "kept changing" is a refusal, which is fine; a leak is not
					t.Logf("round %d: %s", i, res.stderr)
				}
			}
			stop()
			found := r.ok(t, "exec", "--sandbox", id, "--", "sh", "-c", `grep -rl -- "$1" /tmp/got || true`, "sh", secretContent)
			if found != "" {
				t.Fatalf("the root-only host file reached the sandbox: %s", found)
			}
			if failed > rounds/4 {
				t.Fatalf("%d of %d copies failed", failed, rounds)
			}
			kinds := strings.Fields(r.ok(t, "exec", "--sandbox", id, "--", "sh", "-c",
				"find /tmp/got -name f -type l | wc -l; find /tmp/got -name f -type f | wc -l"))
			if len(kinds) != 2 || kinds[0] == "0" || kinds[1] == "0" {
				t.Fatalf("the race was not live: %v links and files copied", kinds)
			}
			t.Logf("%d rounds: %s copied as the symlink, %s as the file, none as the host file", rounds, kinds[0], kinds[1])
		})
	}
}

// TestCopyIntoDirectories: roche cp reads DST as cp and docker cp do, both ways, in
// direct mode and through roched: a directory that exists, or a path ending with /, gets
// SRC inside it under its own name; anything else is the new name; -T makes it the new
// name always. (roche cp f ID:/tmp once failed, "/tmp is on the sandbox's read-only
// root", and ID:/tmp/sub/ made a file named sub.)
func TestCopyIntoDirectories(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	for name, r := range modes(t) {
		t.Run(name, func(t *testing.T) {
			id := r.sandbox(t)
			host := t.TempDir()
			f := filepath.Join(host, "f.txt")
			if err := os.WriteFile(f, []byte("data\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(host, "d")
			if err := os.MkdirAll(filepath.Join(dir, "in"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "in", "g"), []byte("g\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			r.ok(t, "cp", f, id+":/tmp")
			r.ok(t, "cp", f, id+":/tmp/sub/")
			r.ok(t, "cp", f, id+":/tmp/named")
			r.ok(t, "cp", dir, id+":/tmp/sub")
			r.ok(t, "exec", "--sandbox", id, "--", "mkdir", "/tmp/t")
			r.ok(t, "cp", "-T", dir, id+":/tmp/t")
			got := r.ok(t, "exec", "--sandbox", id, "--", "sh", "-c",
				"cd /tmp && find f.txt sub named t -print | sort && cat f.txt sub/f.txt named sub/d/in/g t/in/g")
			want := "f.txt\nnamed\nsub\nsub/d\nsub/d/in\nsub/d/in/g\nsub/f.txt\nt\nt/in\nt/in/g\ndata\ndata\ndata\ng\ng\n"
			if got != want {
				t.Errorf("in the sandbox after copying in:\n%s\nwant\n%s", got, want)
			}

			out := t.TempDir()
			r.ok(t, "cp", id+":/tmp/f.txt", out)
			r.ok(t, "cp", id+":/tmp/f.txt", filepath.Join(out, "new")+"/")
			r.ok(t, "cp", id+":/tmp/f.txt", filepath.Join(out, "renamed"))
			r.ok(t, "cp", id+":/tmp/sub/d", out)
			for p, want := range map[string]string{"f.txt": "data\n", "new/f.txt": "data\n", "renamed": "data\n", "d/in/g": "g\n"} {
				if b, err := os.ReadFile(filepath.Join(out, p)); err != nil || string(b) != want {
					t.Errorf("on the host after copying out, %s: %q %v, want %q", p, b, err, want)
				}
			}
			if res := r.run(t, "cp", "--help"); !strings.Contains(res.stdout, "ends with /") || !strings.Contains(res.stdout, "--no-target-directory") {
				t.Errorf("roche cp --help does not say how DST is read:\n%s", res.stdout)
			}
		})
	}
}
