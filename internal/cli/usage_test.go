package cli

import (
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// testRoot is the command tree as Main builds it.
func testRoot(t *testing.T) *cobra.Command {
	t.Helper()
	e := &env{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" },
		log: slog.New(slog.DiscardHandler)}
	e.owner = func() string { return "cli:usage-test" }
	e.providers = newRegistry(e.log, testLocal, e.handoff)
	return e.rootCommand()
}

func allCommands(c *cobra.Command) []*cobra.Command {
	out := []*cobra.Command{c}
	for _, sub := range c.Commands() {
		if sub.IsAvailableCommand() {
			out = append(out, allCommands(sub)...)
		}
	}
	return out
}

// oneLine checks a refusal as a user sees it: one line on stderr starting "roche: ", a
// non-zero exit, brackets that open and close, and a pointer to the help.
func checkRefusal(t *testing.T, what string, r result) {
	t.Helper()
	msg := strings.TrimPrefix(strings.TrimSuffix(r.stderr, "\n"), "roche: ")
	switch {
	case r.code == 0:
		t.Errorf("%s: exit 0", what)
	case strings.Count(r.stderr, "\n") != 1 || !strings.HasPrefix(r.stderr, "roche: "):
		t.Errorf("%s: want one line starting \"roche: \", got %q", what, r.stderr)
	case strings.Count(msg, "[") != strings.Count(msg, "]") || strings.Contains(msg, " ]") || strings.Contains(msg, "got 0"):
		t.Errorf("%s: a garbled message: %q", what, msg)
	case !strings.Contains(msg, "--help") && !strings.Contains(msg, "usage: "):
		t.Errorf("%s: %q points at no help or usage", what, msg)
	}
}

// TestUsageSweep runs every command of the CLI as a user who gets its arguments or
// flags wrong: too few or too many arguments, a flag one letter short or with two
// letters swapped, a missing or unknown subcommand. Each refusal is one line that says
// what the command takes, or the flag meant, and exits non-zero before doing anything.
func TestUsageSweep(t *testing.T) {
	root := testRoot(t)
	for _, c := range allCommands(root) {
		path := strings.Fields(c.CommandPath())[1:]
		name := strings.Join(append([]string{"roche"}, path...), " ")
		if c.HasSubCommands() {
			if c == root {
				r := run(t, "--direct", "shel")
				checkRefusal(t, "roche shel", r)
				if !strings.Contains(r.stderr, "did you mean roche shell?") {
					t.Errorf("roche shel: %q, want it to suggest roche shell", r.stderr)
				}
				continue
			}
			for _, args := range [][]string{nil, {"bogus"}} {
				r := run(t, append(append([]string{"--direct"}, path...), args...)...)
				checkRefusal(t, name+" "+strings.Join(args, " "), r)
				for _, sub := range c.Commands() {
					if sub.IsAvailableCommand() && !strings.Contains(r.stderr, sub.Name()) {
						t.Errorf("%s %v: %q does not name the subcommand %s", name, args, r.stderr, sub.Name())
					}
				}
			}
			continue
		}
		// Arity, where the command's own check refuses (it runs before anything else).
		if c.Args != nil {
			for _, args := range [][]string{nil, {"a", "b", "c", "d", "e", "f", "g", "h", "i"}} {
				if c.Args(c, args) == nil {
					continue
				}
				r := run(t, append(append([]string{"--direct"}, path...), args...)...)
				checkRefusal(t, name+" with "+gotArgs(args), r)
			}
		}
		// Flags mistyped: refused by the parser before the command runs.
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if f.Hidden || len(f.Name) < 5 {
				return
			}
			short := f.Name[:len(f.Name)-1]
			swapped := f.Name[:2] + string(f.Name[3]) + string(f.Name[2]) + f.Name[4:]
			for _, typo := range []string{short, swapped} {
				if c.Flags().Lookup(typo) != nil {
					continue
				}
				r := run(t, append(append([]string{"--direct"}, path...), "--"+typo)...)
				checkRefusal(t, name+" --"+typo, r)
				meant := ""
				if _, after, ok := strings.Cut(r.stderr, "did you mean --"); ok {
					meant, _, _ = strings.Cut(after, "?")
				}
				if meant == "" || c.Flags().Lookup(meant) == nil || (typo == swapped && meant != f.Name) ||
					(typo == short && !strings.HasPrefix(meant, typo)) {
					t.Errorf("%s --%s: %q, want it to suggest --%s (or a flag it begins)", name, typo, r.stderr, f.Name)
				}
			}
		})
	}
	// The issue's own: --imag is --image's, not the command's in the sandbox.
	r := run(t, "--direct", "run", "--imag", "x", "--", "true")
	if !strings.Contains(r.stderr, "did you mean --image?") || strings.Contains(r.stderr, "after --") {
		t.Errorf("roche run --imag: %q, want did you mean --image", r.stderr)
	}
	// A flag no command has, given to one that runs a command: the command's own goes
	// after --.
	r = run(t, "--direct", "run", "--color", "--", "ls")
	if !strings.Contains(r.stderr, "put the command after --") {
		t.Errorf("roche run --color: %q, want the advice to put the command after --", r.stderr)
	}
	if !slices.Contains([]int{1, 125}, r.code) {
		t.Errorf("roche run --color: exit %d", r.code)
	}
}
