package cli

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche/internal/buildinfo"
	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/daemon/daemontest"
	"github.com/roche-sandbox/roche/internal/doctor"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestDoctor: roche doctor exits 0 when the default provider works here (docker, with
// the test image) and 1 when it does not (wasm as the default, python.wasm missing),
// printing the missing piece and its fix; --json is the report; roched is reported
// absent with how to start it, and present with its version.
func TestDoctor(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	dir := t.TempDir()
	t.Setenv("ROCHE_PYTHON_WASM", filepath.Join(dir, "python.wasm"))
	none := "--socket=" + filepath.Join(dir, "none.sock")

	r := run(t, none, "doctor", "--json", "--image", testImage())
	var rep doctor.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || r.code != 0 {
		t.Fatalf("roche doctor --json with docker working: exit %d, %v\n%s%s", r.code, err, r.stdout, r.stderr)
	}
	if !rep.DefaultOK || rep.Default != "docker" || rep.Roched == nil {
		t.Fatalf("report: default %s ok %v, roched %+v", rep.Default, rep.DefaultOK, rep.Roched)
	}
	if f := *rep.Roched; f.OK || !f.Optional || f.Fix != "roche daemon start" || !strings.Contains(f.Detail, "not answering on "+filepath.Join(dir, "none.sock")) {
		t.Errorf("roched absent: %+v, want optional, not OK, fixed by roche daemon start", f)
	}

	t.Setenv("ROCHE_PROVIDER", "wasm")
	r = run(t, none, "doctor")
	want := "MISSING  wasm, the default: python.wasm: python.wasm (CPython 3.12 for WASI) is not installed at " + filepath.Join(dir, "python.wasm")
	if r.code != 1 || !strings.Contains(r.stdout, want) || !strings.Contains(r.stdout, "\n         fix: roche image build python --provider wasm\n") {
		t.Errorf("roche doctor with wasm the default and no python.wasm: exit %d, want 1, the missing piece and its fix:\n%s%s", r.code, r.stdout, r.stderr)
	}
	t.Setenv("ROCHE_PROVIDER", "")

	s := daemontest.Serve(t, daemon.Config{})
	r = run(t, "--socket="+s.Socket, "doctor", "--json", "--image", testImage())
	rep = doctor.Report{}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || rep.Roched == nil {
		t.Fatalf("roche doctor --json with roched: %v\n%s%s", err, r.stdout, r.stderr)
	}
	if f := *rep.Roched; !f.OK || !strings.HasPrefix(f.Detail, "roched "+buildinfo.Version()+" on "+s.Socket) {
		t.Errorf("roched present: %+v, want it answering, with its version", f)
	}
}

// TestDoctorThinWithoutFullBinary: the thin roche with no roched binary to hand the
// command to still reports, each provider needing the full binary, and exits 1.
func TestDoctorThinWithoutFullBinary(t *testing.T) {
	t.Setenv("PATH", filepath.Join(t.TempDir(), "empty"))
	r := thin(t, "--socket="+filepath.Join(t.TempDir(), "none.sock"), "doctor", "--json")
	var rep doctor.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || r.code != 1 || rep.DefaultOK {
		t.Fatalf("thin roche doctor without roched's binary: exit %d, %v\n%s%s", r.code, err, r.stdout, r.stderr)
	}
	for _, p := range rep.Providers {
		if p.OK || p.Missing != "provider" || !strings.Contains(p.Detail, errNoFullBinary.Error()) {
			t.Errorf("%s: %+v, want it to need the full binary", p.Name, p)
		}
	}
}
