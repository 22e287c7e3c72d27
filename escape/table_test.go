package escape

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// The table in docs/escapes.md is made from what a run saw: checkTable renders the
// columns that ran and compares them with the committed file, which -update rewrites.
// Columns that did not run (a -run selecting one provider) keep their committed cells.

func tablePath() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "docs", "escapes.md")
}

const tableHead = `# Escapes: every provider attacked, and what stopped each attempt

This file is written by the escape suite (package ` + "`escape`" + `), from what its last run saw:
` + "`go test ./escape/ -update`" + ` rewrites it, and ` + "`go test ./escape/`" + ` (part of ` + "`make test`" + `) fails
when a run sees anything else. Each cell is what stopped the case's attempts there: the
errno the sandboxed program got and the guard that returned it; "n/a" where the provider has
no such surface, and why; "OPEN" for a hole found and not fixed yet (the list below says
what was seen; the suite fails once one is in fact closed, so the list cannot go stale).

Every attempt runs as the sandbox's own user, from inside a default sandbox (network off),
or, for the host's side, as an unprivileged local user (uid 65534) and as the host copying
files. No attempt writes to anything outside the suite's own files, and none sends a packet:
addresses off the sandbox are tried with a UDP connect, which asks only the routing table.

`

// render writes the whole file from cells[case][column].
func render(cells map[string]map[string]string) string {
	var b strings.Builder
	b.WriteString(tableHead)
	b.WriteString("| case |")
	for _, c := range columns {
		fmt.Fprintf(&b, " %s |", c.name)
	}
	b.WriteString("\n|---|")
	for range columns {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, c := range cases {
		fmt.Fprintf(&b, "| %s |", c.id)
		for _, col := range columns {
			cell := cells[c.id][col.name]
			if cell == "" {
				cell = "not run"
			}
			fmt.Fprintf(&b, " %s |", strings.ReplaceAll(cell, "|", `\|`))
		}
		b.WriteString("\n")
	}
	b.WriteString("\n## The cases\n\n")
	for _, c := range cases {
		fmt.Fprintf(&b, "- **%s**: %s\n", c.id, c.title)
	}
	b.WriteString("\n## Open holes\n\n")
	if len(knownHoles) == 0 {
		b.WriteString("None.\n")
	}
	for _, h := range knownHoles {
		fmt.Fprintf(&b, "- **%s** on %s: %s\n", h.caseID, h.col, h.why)
	}
	return b.String()
}

// parseTable reads the cells of a committed table.
func parseTable(text string) map[string]map[string]string {
	cells := map[string]map[string]string{}
	var header []string
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "| ") {
			continue
		}
		f := splitRow(line)
		if header == nil {
			header = f
			continue
		}
		row := map[string]string{}
		for i := 1; i < len(f) && i < len(header); i++ {
			row[header[i]] = f[i]
		}
		cells[f[0]] = row
	}
	return cells
}

func splitRow(line string) []string {
	line = strings.Trim(line, "|")
	var out []string
	var cur strings.Builder
	for i := 0; i < len(line); i++ {
		switch {
		case line[i] == '\\' && i+1 < len(line) && line[i+1] == '|':
			cur.WriteByte('|')
			i++
		case line[i] == '|':
			out = append(out, strings.TrimSpace(cur.String()))
			cur.Reset()
		default:
			cur.WriteByte(line[i])
		}
	}
	return append(out, strings.TrimSpace(cur.String()))
}

// checkTable compares the table with what this run saw, or rewrites it with -update.
func checkTable(t *testing.T) {
	seenMu.Lock()
	defer seenMu.Unlock()
	if len(seen) == 0 {
		return
	}
	old, err := os.ReadFile(tablePath())
	if err != nil && !*update {
		t.Fatalf("reading the table: %v (go test ./escape/ -update writes it)", err)
	}
	cells := parseTable(string(old))
	for _, c := range cases {
		if cells[c.id] == nil {
			cells[c.id] = map[string]string{}
		}
		for col, obs := range seen {
			v := c.judge(col, obs)
			cell := v.cell
			if h, ok := holeOf(c.id, col); ok && v.status == "OPEN" {
				cell = "OPEN: " + h.why
			}
			cells[c.id][col] = cell
		}
	}
	want := render(cells)
	if *update {
		if err := os.WriteFile(tablePath(), []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if string(old) != want {
		ol, nl := strings.Split(string(old), "\n"), strings.Split(want, "\n")
		var diff []string
		for i := 0; i < max(len(ol), len(nl)); i++ {
			var a, b string
			if i < len(ol) {
				a = ol[i]
			}
			if i < len(nl) {
				b = nl[i]
			}
			if a != b {
				diff = append(diff, "- "+a, "+ "+b)
			}
		}
		t.Errorf("docs/escapes.md differs from what this run saw (go test ./escape/ -update rewrites it):\n%s", strings.Join(diff, "\n"))
	}
}

func holeOf(caseID, col string) (hole, bool) {
	for _, h := range knownHoles {
		if h.caseID == caseID && h.col == col {
			return h, true
		}
	}
	return hole{}, false
}
