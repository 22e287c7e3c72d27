package cli

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

var badFlagValue = regexp.MustCompile(`^invalid argument "(.*)" for "(.*)" flag: `)

// flagError says what a flag wants instead of quoting the parser that refused it; for
// an unknown flag, the one meant (a flag it begins, or one a typo or two away) or, for a
// command that runs a command, that the command's own flags go after "--".
func flagError(c *cobra.Command, err error) error {
	msg := err.Error()
	if m := badFlagValue.FindStringSubmatch(msg); m != nil {
		name := m[2]
		if i := strings.Index(name, "--"); i >= 0 {
			name = name[i:]
		}
		want := "another value"
		if f := c.Flags().Lookup(strings.TrimPrefix(name, "--")); f != nil {
			want = wants(f)
		}
		return fmt.Errorf("%s %q: want %s (see %s --help)", name, m[1], want, c.CommandPath())
	}
	if name, ok := strings.CutPrefix(msg, "unknown flag: --"); ok {
		if meant := nearestFlag(c, name); meant != "" {
			return fmt.Errorf("unknown flag --%s: did you mean --%s? (see %s --help)", name, meant, c.CommandPath())
		}
	}
	if takesCommand(c) && (strings.HasPrefix(msg, "unknown shorthand flag") || strings.HasPrefix(msg, "unknown flag")) {
		return fmt.Errorf("%v: if it is the command's own, put the command after --: %s [flags] -- CMD [ARGS...] (see %s --help)", err, c.CommandPath(), c.CommandPath())
	}
	return fmt.Errorf("%v (see %s --help)", err, c.CommandPath())
}

// nearestFlag is the flag of c that name was most likely meant to be: the shortest one
// that name begins (--imag, --mem), else the nearest within two edits (--imgae), if
// only one is that near; "" when none is.
func nearestFlag(c *cobra.Command, name string) string {
	var prefixed, near []string
	best := 3
	c.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		if strings.HasPrefix(f.Name, name) {
			prefixed = append(prefixed, f.Name)
		}
		switch d := editDistance(name, f.Name); {
		case d < best:
			best, near = d, []string{f.Name}
		case d == best:
			near = append(near, f.Name)
		}
	})
	if len(prefixed) > 0 {
		shortest := prefixed[0]
		for _, n := range prefixed[1:] {
			if len(n) < len(shortest) {
				shortest = n
			}
		}
		return shortest
	}
	if len(near) == 1 && best <= max(1, len(name)/3) {
		return near[0]
	}
	return ""
}

// editDistance is the Levenshtein distance between a and b, a transposition counting one.
func editDistance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// wants describes the values a flag takes.
func wants(f *pflag.Flag) string {
	switch f.Value.Type() {
	case "int", "int32", "int64", "uint", "uint32", "uint64":
		return "a whole number"
	case "float32", "float64":
		return "a number, such as 0.5 or 2"
	case "duration":
		return "a duration, such as 30s or 2m"
	case "bool":
		return "true or false"
	}
	return "another value"
}

// takesCommand: the command runs a command given after "--" (run, exec).
func takesCommand(c *cobra.Command) bool {
	return strings.Contains(c.Use, "CMD")
}

// flagGroups are the "[--flag VALUE]" and "[flags]" parts of a usage line (not
// "[-- CMD [ARGS...]]", which is arguments).
var flagGroups = regexp.MustCompile(`\[(?:flags|--?[A-Za-z][^\]]*)\]`)

// namedFlags are the "--flag VALUE" and "--flag" parts of a usage line outside brackets.
var namedFlags = regexp.MustCompile(`(?:^|\s)--?[A-Za-z][\w-]*(?:\s+[A-Z][A-Z0-9_/.]*)?`)

var argCount = regexp.MustCompile(`^(?:accepts|requires) (?:at (?:least|most) |between \d+ and )?(\d+)(?: arg\(s\)|,)?.*received (\d+)$`)

// friendlyArgs wraps every command's argument check so that a wrong count says what the
// command takes, with its usage line, instead of "accepts 2 arg(s), received 0"; and
// makes every command that only groups others (roche snapshot, roche pool) refuse a
// missing or unknown subcommand in one line, naming them, instead of printing its help
// and exiting 0.
func friendlyArgs(c *cobra.Command) {
	for _, sub := range c.Commands() {
		friendlyArgs(sub)
	}
	if c.HasSubCommands() {
		subcommandsOnly(c)
		return
	}
	check := c.Args
	if check == nil {
		return
	}
	c.Args = func(cmd *cobra.Command, args []string) error {
		err := check(cmd, args)
		if err == nil {
			return nil
		}
		if argCount.MatchString(err.Error()) || strings.HasPrefix(err.Error(), "unknown command") {
			return fmt.Errorf("%s takes %s, got %s (usage: %s)", cmd.CommandPath(), argNames(cmd), gotArgs(args), cmd.UseLine())
		}
		return err
	}
}

// subcommandsOnly makes c, which groups subcommands, refuse to run without one, and an
// unknown one with the nearest name. The root alone prints its help when given nothing.
func subcommandsOnly(c *cobra.Command) {
	var names []string
	for _, sub := range c.Commands() {
		if sub.IsAvailableCommand() {
			names = append(names, sub.Name())
		}
	}
	list := strings.Join(names, ", ")
	if i := strings.LastIndex(list, ", "); i >= 0 {
		list = list[:i] + " or " + list[i+2:]
	}
	if !c.HasParent() {
		// The root's unknown command is cobra's (it never runs the root's Args), and
		// rewritten by unknownCommand.
		return
	}
	c.Args = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return nil
		}
		return noSubcommand(cmd, args[0], "give "+list)
	}
	c.RunE = func(cmd *cobra.Command, _ []string) error {
		return fmt.Errorf("give a subcommand: %s (see %s --help)", list, cmd.CommandPath())
	}
}

func noSubcommand(c *cobra.Command, name, otherwise string) error {
	what := "subcommand"
	if !c.HasParent() {
		what = "command"
	}
	msg := fmt.Sprintf("%s has no %s %q", c.CommandPath(), what, name)
	if s := c.SuggestionsFor(name); len(s) > 0 {
		msg += fmt.Sprintf(": did you mean %s %s?", c.CommandPath(), s[0])
	} else if otherwise != "" {
		msg += ": " + otherwise
	}
	return fmt.Errorf("%s (see %s --help)", msg, c.CommandPath())
}

var unknownCommandError = regexp.MustCompile(`^unknown command "([^"]*)" for "[^"]*"`)

// unknownCommand rewrites cobra's unknown command of the root (several lines, "Did you
// mean this?") as one line that says what to do.
func unknownCommand(c *cobra.Command, err error) error {
	if c == nil || c.HasParent() {
		return err
	}
	if m := unknownCommandError.FindStringSubmatch(err.Error()); m != nil {
		return noSubcommand(c, m[1], "")
	}
	return err
}

// gotArgs says which arguments a command was given.
func gotArgs(args []string) string {
	if len(args) == 0 {
		return "none"
	}
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = fmt.Sprintf("%q", a)
	}
	return fmt.Sprintf("%d (%s)", len(args), strings.Join(q, " "))
}

// argNames is what a command's usage line says it takes after its name, its flags left
// out.
func argNames(c *cobra.Command) string {
	_, rest, _ := strings.Cut(c.Use, " ")
	rest = flagGroups.ReplaceAllString(rest, "")
	rest = namedFlags.ReplaceAllString(" "+rest, "")
	rest = strings.Join(strings.Fields(rest), " ")
	if rest == "" {
		return "no arguments"
	}
	return rest
}
