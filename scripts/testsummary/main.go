// Command testsummary reads `go test -json` on stdin and writes what a person reads: a
// line per package as go test prints it, the output of every test that failed (and of a
// package that failed outside its tests), then the tests that skipped counted by their
// reason, and one last line with the totals. It exits 1 when anything failed or the
// stream ended without a package's result. make check (scripts/check.sh) pipes its go
// test through it, so that what the fast tier left out is counted, not scrolled past.
//
//	go test -json ./... | go run ./scripts/testsummary
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
)

func main() {
	if len(os.Args) > 1 {
		fmt.Fprintln(os.Stderr, "usage: go test -json ./... | go run ./scripts/testsummary (no arguments)")
		os.Exit(2)
	}
	os.Exit(summarize(os.Stdin, os.Stdout))
}

// event is one line of go test -json (cmd/test2json).
type event struct {
	Action     string
	Package    string
	Test       string
	Elapsed    float64
	Output     string
	ImportPath string // build-output and build-fail
}

type key struct{ pkg, test string }

// subtests counts the subtests of a top-level test (nested ones too) that ended, and
// those that skipped.
type subtests struct {
	n, skipped int
	reason     string // the first skip's
}

type tally struct {
	passed, failed, skipped int
	packages, failedPkgs    int
	noTests                 int
	reasons                 map[string]int
	started                 map[string]bool // packages begun and not yet ended
}

func summarize(r io.Reader, w io.Writer) int {
	out := map[key][]string{}
	build := map[string][]string{}
	subs := map[key]subtests{} // of top-level tests still running
	t := tally{reasons: map[string]int{}, started: map[string]bool{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil || e.Action == "" {
			// Not test2json: go vet's or the linker's own words. Pass them on.
			fmt.Fprintf(w, "%s\n", line)
			continue
		}
		k := key{e.Package, e.Test}
		switch e.Action {
		case "build-output":
			build[e.ImportPath] = append(build[e.ImportPath], e.Output)
		case "build-fail":
			fmt.Fprint(w, strings.Join(build[e.ImportPath], ""))
			delete(build, e.ImportPath)
		case "start":
			t.started[e.Package] = true
		case "output":
			out[k] = append(out[k], e.Output)
		case "pass", "fail", "skip":
			if e.Test == "" {
				t.endPackage(w, e, out)
				continue
			}
			// Subtests' lines come under their own names; totals count top-level tests.
			// One that passed with every subtest skipped counts as skipped, for their reason.
			top, _, isSub := strings.Cut(e.Test, "/")
			tk := key{e.Package, top}
			if isSub {
				s := subs[tk]
				s.n++
				if e.Action == "skip" {
					s.skipped++
					if s.reason == "" {
						s.reason = skipReason(out[k])
					}
				}
				subs[tk] = s
			}
			switch {
			case e.Action == "fail":
				fmt.Fprint(w, strings.Join(out[k], ""))
				if !isSub {
					t.failed++
				}
			case !isSub && e.Action == "pass" && subs[tk].n > 0 && subs[tk].skipped == subs[tk].n:
				t.skipped++
				t.reasons[subs[tk].reason]++
			case !isSub && e.Action == "pass":
				t.passed++
			case !isSub && e.Action == "skip":
				t.skipped++
				t.reasons[skipReason(out[k])]++
			}
			if !isSub {
				delete(subs, tk)
			}
			delete(out, k)
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(w, "reading go test's output:", err)
		return 1
	}
	for pkg := range t.started {
		fmt.Fprintf(w, "FAIL\t%s\t(no result: go test stopped before it ended)\n", pkg)
		t.failedPkgs++
	}
	t.report(w)
	if t.failed > 0 || t.failedPkgs > 0 {
		return 1
	}
	return 0
}

func (t *tally) endPackage(w io.Writer, e event, out map[key][]string) {
	delete(t.started, e.Package)
	k := key{e.Package, ""}
	lines := out[k]
	delete(out, k)
	// As go test prints it (1.390s), not as a float64 sums it (1.3900000000000001).
	elapsed := fmt.Sprintf("%.3fs", e.Elapsed)
	switch e.Action {
	case "skip":
		t.noTests++
		fmt.Fprintf(w, "?   \t%s\t[no test files]\n", e.Package)
	case "pass":
		t.packages++
		fmt.Fprintf(w, "ok  \t%s\t%s\n", e.Package, elapsed)
	case "fail":
		t.packages++
		t.failedPkgs++
		// What the package printed outside its tests: a TestMain's error, a panic, a
		// leak found after the tests, a timeout.
		for _, l := range lines {
			if !strings.HasPrefix(l, "FAIL") && !strings.HasPrefix(l, "ok  ") {
				fmt.Fprint(w, l)
			}
		}
		// Output of tests that never ended (a panic or a timeout mid-test).
		for o, ls := range out {
			if o.pkg == e.Package {
				fmt.Fprint(w, strings.Join(ls, ""))
				delete(out, o)
			}
		}
		fmt.Fprintf(w, "FAIL\t%s\t%s\n", e.Package, elapsed)
	}
}

// skipLine is how t.Skip's message appears in a test's output: "    file_test.go:12: why".
var skipLine = regexp.MustCompile(`^\s+\S+\.go:\d+: (.*)$`)

// skipReason is the message a skipped test gave, the last logged line before its
// "--- SKIP".
func skipReason(lines []string) string {
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimRight(lines[i], "\n")
		if m := skipLine.FindStringSubmatch(l); m != nil {
			return m[1]
		}
	}
	return "(no reason given)"
}

func (t *tally) report(w io.Writer) {
	if t.skipped > 0 {
		fmt.Fprintln(w, "skipped, by reason:")
		reasons := make([]string, 0, len(t.reasons))
		for r := range t.reasons {
			reasons = append(reasons, r)
		}
		slices.SortFunc(reasons, func(a, b string) int {
			if d := t.reasons[b] - t.reasons[a]; d != 0 {
				return d
			}
			return strings.Compare(a, b)
		})
		for _, r := range reasons {
			fmt.Fprintf(w, "%6d  %s\n", t.reasons[r], r)
		}
	}
	status := "ok"
	if t.failed > 0 || t.failedPkgs > 0 {
		status = "FAIL"
	}
	fmt.Fprintf(w, "%s: %d tests passed, %d skipped, %d failed, in %d packages (%d failed; %d without tests)\n",
		status, t.passed, t.skipped, t.failed, t.packages, t.failedPkgs, t.noTests)
}
