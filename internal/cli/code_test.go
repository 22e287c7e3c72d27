package cli

import (
	"bufio"
	"encoding/json"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestCodeJSONEvents: roche code --json-events, which the SDKs' CLI transports read,
// prints output as base64 chunks while the cell runs and the whole execution last, and
// exits as roche code does (1 for an exception).
func TestCodeJSONEvents(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	r := run(t, "create", "--image", testImage())
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { run(t, "destroy", id) })

	if r := rocheIn(t, "x = 41", "code", "--sandbox", id, "--json-events"); r.code != 0 {
		t.Fatalf("x = 41: %+v", r)
	}
	r = rocheIn(t, "print('hé')\nx + 1", "code", "--sandbox", id, "--json-events")
	if r.code != 0 {
		t.Fatalf("x + 1: %+v", r)
	}
	type event struct {
		Stream    string          `json:"stream"`
		Data      []byte          `json:"data"`
		Execution json.RawMessage `json:"execution"`
	}
	var lines []event
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	for sc.Scan() {
		var ev event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		lines = append(lines, ev)
	}
	if len(lines) < 2 || lines[0].Stream != "stdout" || string(lines[0].Data) != "hé\n" || lines[len(lines)-1].Execution == nil {
		t.Fatalf("events: %s", r.stdout)
	}
	var ex struct {
		Results []struct {
			Text         string `json:"text"`
			IsMainResult bool   `json:"is_main_result"`
		} `json:"results"`
		ExecutionCount int `json:"execution_count"`
	}
	if err := json.Unmarshal(lines[len(lines)-1].Execution, &ex); err != nil || len(ex.Results) != 1 || ex.Results[0].Text != "42" || !ex.Results[0].IsMainResult || ex.ExecutionCount != 2 {
		t.Fatalf("execution: %s (%v)", lines[len(lines)-1].Execution, err)
	}

	r = rocheIn(t, "1 / 0", "code", "--sandbox", id, "--json-events")
	if r.code != 1 || !strings.Contains(r.stdout, `"name":"ZeroDivisionError"`) {
		t.Fatalf("1 / 0: %+v", r)
	}
}

// TestCodeTimeoutReport: a cell stopped at its timeout says which limit it was (as
// asked) and that the context keeps its variables, with a traceback of the user's
// code only (the interrupt is raised in the kernel's handler, which is not shown).
func TestCodeTimeoutReport(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	r := run(t, "create", "--image", testImage())
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { run(t, "destroy", id) })
	r = run(t, "code", "--sandbox", id, "--timeout", "1", "import time\nwhile True:\n    time.sleep(0.01)")
	if r.code != 124 || !strings.Contains(r.stderr, `File "<cell-1>", line 3`) || strings.Contains(r.stderr, "roche-kernel") ||
		!strings.Contains(r.stderr, "roche: the cell timed out: its 1s limit (--timeout) interrupted it after it ran ") ||
		!strings.Contains(r.stderr, "the context keeps its variables") {
		t.Fatalf("a cell at its timeout: %+v", r)
	}
}
