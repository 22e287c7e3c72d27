package oci_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/oci"
)

// seccompEntry is the disk cache's file (provider/oci/runtime.go).
type seccompEntry struct {
	Key    string `json:"key"`
	SHA256 string `json:"sha256"`
	BPF    string `json:"bpf"`
}

// allowAll is a seccomp program of one instruction, return SECCOMP_RET_ALLOW: what an
// attacker would have crun load in place of Roche's filter.
var allowAll = []byte{0x06, 0, 0, 0, 0x00, 0x00, 0xff, 0x7f}

func entryOf(key string, bpf []byte) []byte {
	sum := sha256.Sum256(bpf)
	b, _ := json.Marshal(seccompEntry{Key: key, SHA256: hex.EncodeToString(sum[:]), BPF: base64.StdEncoding.EncodeToString(bpf)})
	return b
}

// compiledAnnotation is the compiled filter sandbox id was handed (crun's
// run.oci.seccomp_bpf_data), "" for none.
func compiledAnnotation(t *testing.T, state, id string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(state, id, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	return spec.Annotations["run.oci.seccomp_bpf_data"]
}

// seccompCacheProvider opens a provider with crun on a state directory of the test's
// own, and the cache's file there once its first sandbox has been made.
func seccompCacheProvider(t *testing.T) (state string, entry seccompEntry) {
	t.Helper()
	if runtime.GOARCH != "amd64" {
		t.Skip("the probe's system call numbers are amd64's")
	}
	p, state := newProvider(t, oci.WithRuntime(oci.RuntimeCrun))
	return state, firstEntry(t, p, state)
}

// firstEntry makes and destroys p's first sandbox, and returns the cache's entry then.
func firstEntry(t *testing.T, p *oci.Provider, state string) seccompEntry {
	t.Helper()
	ctx := context.Background()
	info, err := p.Create(ctx, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Destroy(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	return readEntry(t, state)
}

func readEntry(t *testing.T, state string) seccompEntry {
	t.Helper()
	file := filepath.Join(state, "seccomp-crun.json")
	fi, err := os.Lstat(file)
	if err != nil {
		t.Fatalf("no compiled filter kept on disk: %v", err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o600 || st.Uid != 0 || !fi.Mode().IsRegular() {
		t.Errorf("%s: mode %v, uid %d, want a regular file of root's, 0600", file, fi.Mode(), st.Uid)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var e seccompEntry
	if err := json.Unmarshal(b, &e); err != nil || e.Key == "" || e.BPF == "" {
		t.Fatalf("the cache's entry %q: %v", b, err)
	}
	return e
}

// createIn makes one sandbox (as root in it, where only the filter stands between its
// code and the calls Roche refuses) with a provider opened anew on state, as a new
// process would, and returns the compiled filter it was handed and what the refused
// calls returned in it.
func createIn(t *testing.T, state string) (handed, calls string) {
	t.Helper()
	p, err := oci.New(oci.WithStateDir(state), oci.WithDataDir("/var/lib/roche-test/oci"), oci.WithRuntime(oci.RuntimeCrun))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	cfg := testConfig()
	cfg.User = "root"
	info, err := p.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Destroy(ctx, info.ID)
	res, err := p.Exec(ctx, info.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", forbiddenSyscalls}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%+v %v", res, err)
	}
	return compiledAnnotation(t, state, info.ID), strings.TrimSpace(res.Stdout)
}

const refused = "unshare_user=1 personality=1 add_key=1 keyctl=1 bpf=1 getpid=0"

// TestSeccompCacheAcrossProcesses: crun's compilation of Roche's filter for a process's
// first sandbox is kept on disk (root's, 0600), and the next process's first sandbox is
// handed it, with the filter holding there as in the first.
func TestSeccompCacheAcrossProcesses(t *testing.T) {
	state, e := seccompCacheProvider(t)
	handed, calls := createIn(t, state)
	if handed != e.BPF {
		t.Errorf("the next process's first sandbox was handed %d bytes of base64, want the %d kept on disk", len(handed), len(e.BPF))
	}
	if calls != refused {
		t.Errorf("in a sandbox handed the kept filter: %s, want %s", calls, refused)
	}
}

// TestSeccompCacheDamaged: an entry whose filter does not match its digest (a torn or
// corrupted file), or whose key is another's (another crun, kernel or filter), is not
// handed to any sandbox; crun compiles the filter again, and the entry is replaced by
// that compilation.
func TestSeccompCacheDamaged(t *testing.T) {
	state, e := seccompCacheProvider(t)
	file := filepath.Join(state, "seccomp-crun.json")
	good, _ := base64.StdEncoding.DecodeString(e.BPF)
	damaged := append([]byte(nil), good...)
	damaged[len(damaged)-4] ^= 0xff // the last instruction's value
	// The digest of the good filter, over damaged bytes.
	torn, _ := json.Marshal(seccompEntry{Key: e.Key, SHA256: e.SHA256, BPF: base64.StdEncoding.EncodeToString(damaged)})
	for name, content := range map[string][]byte{
		"digest mismatch": torn,
		"not JSON":        []byte(`{"key":"` + e.Key + `","sha256":`),
		"stale key":       entryOf(strings.Repeat("0", len(e.Key)), good),
		"not a program":   entryOf(e.Key, good[:len(good)-3]),
	} {
		t.Run(name, func(t *testing.T) {
			if err := os.WriteFile(file, content, 0o600); err != nil {
				t.Fatal(err)
			}
			handed, calls := createIn(t, state)
			if handed != "" {
				t.Errorf("a sandbox was handed %d bytes of base64 from a damaged entry, want none (crun compiles)", len(handed))
			}
			if calls != refused {
				t.Errorf("%s, want %s", calls, refused)
			}
			if again := readEntry(t, state); again != e {
				t.Errorf("the entry was not rebuilt: key %s sha256 %s, want %s %s", again.Key, again.SHA256, e.Key, e.SHA256)
			}
		})
	}
}

// TestSeccompCachePlanted: the attack on the cache. A filter that allows every call,
// planted where the cache is read, under the right key and with a digest that matches,
// would replace Roche's filter in every sandbox. Planted by a second local user (in a
// state directory others may write, sticky or not) or left writable by others, it is
// ignored: sandboxes are not handed it and the calls Roche refuses stay refused, as
// root in the sandbox. Written by root, 0600, in a directory only root may change, the
// same entry is used, which shows the test sees a planted filter when one gets through.
func TestSeccompCachePlanted(t *testing.T) {
	testenv.Needs(t, testenv.Root, testenv.Docker)
	if runtime.GOARCH != "amd64" {
		t.Skip("the probe's system call numbers are amd64's")
	}
	// A state directory the second user can reach, unlike the tests' shared one.
	state := testenv.ReachableStateDir(t, "/run", "roche-test-seccomp-")
	p, err := oci.New(oci.WithStateDir(state), oci.WithDataDir("/var/lib/roche-test/oci"), oci.WithRuntime(oci.RuntimeCrun))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Close()
		if err := unix.Unmount(state, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			t.Errorf("unmounting the state directory's tmpfs: %v", err)
		}
	})
	e := firstEntry(t, p, state)
	file := filepath.Join(state, "seccomp-crun.json")
	planted := entryOf(e.Key, allowAll)
	plantedB64 := base64.StdEncoding.EncodeToString(allowAll)
	for _, plant := range testenv.Plants(t, state, file, planted, "rocheatk") {
		t.Run(plant.Name, func(t *testing.T) {
			plant.Do(t)
			handed, calls := createIn(t, state)
			if handed == plantedB64 {
				t.Errorf("a sandbox was handed the planted filter")
			}
			if calls != refused {
				t.Errorf("with a planted filter: %s, want %s", calls, refused)
			}
		})
	}
	t.Run("control: root's own entry is used", func(t *testing.T) {
		testenv.PlantOwn(t, file, planted)
		handed, calls := createIn(t, state)
		if handed != plantedB64 {
			t.Fatalf("root's own entry was not used (handed %d bytes): the cases above prove nothing", len(handed))
		}
		if calls == refused {
			t.Errorf("the allow-all filter was handed but calls were refused: %s", calls)
		}
		t.Logf("with the allow-all filter: %s", calls)
		os.Remove(file)
	})
}
