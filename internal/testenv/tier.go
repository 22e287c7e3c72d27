package testenv

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The test tiers. make test runs the full tier: everything, against the real engines,
// which scripts/test.sh sets up first. make check runs the fast tier (ROCHE_TEST_TIER=fast):
// only the tests that need nothing but Go, as any user on a fresh clone, with -race; a
// test that needs more says what in one line (Needs) and skips, and scripts/check.sh
// counts those lines.
const (
	TierEnv  = "ROCHE_TEST_TIER"
	TierFast = "fast"
	TierFull = "full"
)

// A Need is something outside Go that a test uses: what make test sets up and make
// check does without.
type Need string

const (
	Root       Need = "root"
	Docker     Need = "a Docker engine and roche/python:local"
	Cluster    Need = "the test cluster"
	QEMU       Need = "QEMU and a kernel"
	PythonWasm Need = "python.wasm"
	// Tools the tests run that a fresh machine may lack (make test installs them).
	Tmux    Need = "tmux"
	Tcpdump Need = "tcpdump"
	Node    Need = "Node and npm"
	Python  Need = "python3"
	// Chromium is Debian's chromium, the headless browser the console's tests drive.
	Chromium Need = "chromium"
)

// tool is the command whose presence a Need is, for those that are one.
var tool = map[Need]string{QEMU: "qemu-system-x86_64", Tmux: "tmux", Tcpdump: "tcpdump", Node: "npm", Python: "python3", Chromium: "chromium"}

// Fast reports whether the tests run in the fast tier. A TestMain whose set-up needs
// something (building an image, starting the cluster) leaves it out when Fast, and the
// tests that use it call Needs.
func Fast() bool {
	return os.Getenv(TierEnv) == TierFast
}

// Needs declares what a test needs beyond Go. In the fast tier the test skips with one
// line, "fast tier: needs X, Y", whether or not this machine has them, so that make check
// runs the same tests everywhere. In the full tier (make test) it never skips: a need this
// machine visibly lacks (root, a tool not on PATH) fails the test with what is missing,
// and the others fail on their own in the test's set-up.
func Needs(t testing.TB, needs ...Need) {
	t.Helper()
	names := make([]string, len(needs))
	for i, n := range needs {
		names[i] = string(n)
	}
	if Fast() {
		t.Skip("fast tier: needs " + strings.Join(names, ", "))
	}
	for _, n := range needs {
		if missing(n) {
			t.Fatalf("needs %s, which this machine lacks: make test (scripts/test.sh, as root) sets it up", n)
		}
	}
}

func missing(n Need) bool {
	if n == Root {
		return os.Geteuid() != 0
	}
	if cmd, ok := tool[n]; ok {
		_, err := exec.LookPath(cmd)
		return err != nil
	}
	return false
}
