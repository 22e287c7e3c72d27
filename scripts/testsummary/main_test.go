package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// stream writes go test -json events, as cmd/test2json does.
func stream(t *testing.T, events ...event) string {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	for _, e := range events {
		if err := enc.Encode(e); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}

func out(pkg, test, line string) event {
	return event{Action: "output", Package: pkg, Test: test, Output: line}
}

// TestCounts: passes, skips by reason (a test whose subtests all skipped among them),
// and failures with their lines; a failure makes the exit code 1.
func TestCounts(t *testing.T) {
	const p = "example.com/p"
	in := stream(t,
		event{Action: "start", Package: p},
		out(p, "TestA", "=== RUN   TestA\n"), event{Action: "pass", Package: p, Test: "TestA"},
		out(p, "TestB", "    b_test.go:9: fast tier: needs root\n"), event{Action: "skip", Package: p, Test: "TestB"},
		out(p, "TestC", "    c_test.go:3: fast tier: needs root\n"), event{Action: "skip", Package: p, Test: "TestC"},
		out(p, "TestD/x", "    d_test.go:5: fast tier: needs a Docker engine\n"), event{Action: "skip", Package: p, Test: "TestD/x"},
		out(p, "TestD/y", "    d_test.go:5: fast tier: needs a Docker engine\n"), event{Action: "skip", Package: p, Test: "TestD/y"},
		event{Action: "pass", Package: p, Test: "TestD"},
		out(p, "TestE/x", "    e_test.go:5: fast tier: needs root\n"), event{Action: "skip", Package: p, Test: "TestE/x"},
		event{Action: "pass", Package: p, Test: "TestE/y"},
		event{Action: "pass", Package: p, Test: "TestE"},
		out(p, "TestF", "    f_test.go:7: got 1, want 2\n"), out(p, "TestF", "--- FAIL: TestF (0.00s)\n"),
		event{Action: "fail", Package: p, Test: "TestF"},
		out(p, "", "FAIL\n"),
		event{Action: "fail", Package: p, Elapsed: 1.5},
		event{Action: "start", Package: "example.com/none"},
		event{Action: "skip", Package: "example.com/none"},
		event{Action: "start", Package: "example.com/ok"},
		event{Action: "pass", Package: "example.com/ok", Elapsed: 1.3900000000000001},
	)
	var w bytes.Buffer
	if code := summarize(strings.NewReader(in), &w); code != 1 {
		t.Errorf("exit code %d with a failed test, want 1", code)
	}
	got := w.String()
	for _, want := range []string{
		"f_test.go:7: got 1, want 2\n--- FAIL: TestF",
		"FAIL\texample.com/p\t1.500s\n",
		"?   \texample.com/none\t[no test files]\n",
		"ok  \texample.com/ok\t1.390s\n",
		"     2  fast tier: needs root\n     1  fast tier: needs a Docker engine\n",
		"FAIL: 2 tests passed, 3 skipped, 1 failed, in 2 packages (1 failed; 1 without tests)\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the summary lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "=== RUN") {
		t.Errorf("a passing test's lines were printed:\n%s", got)
	}
}

// TestUnfinishedPackage: a stream that ends before a package's result (go test killed)
// is a failure, not a pass.
func TestUnfinishedPackage(t *testing.T) {
	in := stream(t, event{Action: "start", Package: "example.com/p"}, event{Action: "pass", Package: "example.com/p", Test: "TestA"})
	var w bytes.Buffer
	if code := summarize(strings.NewReader(in), &w); code != 1 || !strings.Contains(w.String(), "FAIL\texample.com/p\t(no result") {
		t.Fatalf("exit %d:\n%s", code, w.String())
	}
}

// TestRealGoTest runs go test -json on a package of its own and reads what it says.
func TestRealGoTest(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go test")
	}
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/m\n\ngo 1.25\n")
	write("m_test.go", `package m

import "testing"

func TestPass(t *testing.T) {}
func TestSkip(t *testing.T) { t.Skip("fast tier: needs root") }
func TestSubs(t *testing.T) {
	t.Run("a", func(t *testing.T) { t.Skip("fast tier: needs root") })
	t.Run("b", func(t *testing.T) { t.Skip("fast tier: needs root") })
}
`)
	cmd := exec.Command("go", "test", "-json", "-count=1", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("go test: %v\n%s", err, b)
	}
	var w bytes.Buffer
	if code := summarize(bytes.NewReader(b), &w); code != 0 {
		t.Fatalf("exit %d:\n%s", code, w.String())
	}
	if got := w.String(); !strings.Contains(got, "     2  fast tier: needs root\n") || !strings.HasSuffix(got, "ok: 1 tests passed, 2 skipped, 0 failed, in 1 packages (0 failed; 0 without tests)\n") {
		t.Fatalf("summary:\n%s", got)
	}
}
