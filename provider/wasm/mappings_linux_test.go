package wasm

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestCloseUnmaps: a provider maps of the rewritten python.wasm only its data, whether
// it wrote the file or found it kept, and maps the pre-initialised copy it finds kept;
// Close releases both, so that a process opening and closing providers (tests, roched
// reopening one) does not gather mappings of ~14 MB each time.
func TestCloseUnmaps(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	ctx := context.Background()
	dir := t.TempDir()
	for _, round := range []string{"writes the files", "finds them kept"} {
		p, err := New(WithStateDir(dir))
		if err != nil {
			t.Fatal(err)
		}
		info, err := p.Create(ctx, roche.DefaultConfig())
		if err != nil {
			p.Close()
			t.Fatal(err)
		}
		res, err := p.Exec(ctx, info.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "print(6 * 7)"}})
		p.Destroy(ctx, info.ID)
		if err != nil || res.ExitCode != 0 || res.Stdout != "42\n" {
			p.Close()
			t.Fatalf("%s: %+v %v", round, res, err)
		}
		data := 0
		for _, s := range p.pythonData.Load().segs {
			data += len(s.data)
		}
		mapped := mappedFiles(t, p.stateDir)
		rewritten := mapped[filepath.Join(p.stateDir, rewrittenFile)]
		if data == 0 || rewritten < data || rewritten > data+2*os.Getpagesize() {
			t.Errorf("%s: %d bytes of %s mapped for %d bytes of data", round, rewritten, rewrittenFile, data)
		}
		copies := 0
		for file := range mapped {
			if strings.HasPrefix(filepath.Base(file), "python-preinit-") {
				copies++
			}
		}
		if want := map[bool]int{true: 1, false: 0}[round == "finds them kept"]; copies != want || p.preinitRuns.Load() == 0 {
			t.Errorf("%s: %d copies mapped, want %d; %d runs from a copy", round, copies, want, p.preinitRuns.Load())
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		if left := mappedFiles(t, p.stateDir); len(left) > 0 {
			t.Errorf("%s: still mapped after Close: %v", round, left)
		}
	}
}

// mappedFiles returns the bytes this process maps of each file under dir
// (/proc/self/maps).
func mappedFiles(t *testing.T, dir string) map[string]int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]int{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || !strings.HasPrefix(f[5], dir+"/") {
			continue
		}
		from, to, _ := strings.Cut(f[0], "-")
		lo, err1 := strconv.ParseUint(from, 16, 64)
		hi, err2 := strconv.ParseUint(to, 16, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("/proc/self/maps: %q", line)
		}
		files[f[5]] += int(hi - lo)
	}
	return files
}
