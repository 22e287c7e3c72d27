package cli

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

var badFlagValue = regexp.MustCompile(`^invalid argument "(.*)" for "(.*)" flag: `)

// flagError says what a flag wants instead of quoting the parser that refused it, and,
// for a command that runs a command, that the command's own flags go after "--".
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
	if takesCommand(c) && (strings.HasPrefix(msg, "unknown shorthand flag") || strings.HasPrefix(msg, "unknown flag")) {
		return fmt.Errorf("%v: if it is the command's own, put the command after --: %s [flags] -- CMD [ARGS...] (see %s --help)", err, c.CommandPath(), c.CommandPath())
	}
	return fmt.Errorf("%v (see %s --help)", err, c.CommandPath())
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

// flagGroups are the "[--flag VALUE]" and "[flags]" parts of a usage line.
var flagGroups = regexp.MustCompile(`\[(?:flags|-[^\]]*)\]`)

var argCount = regexp.MustCompile(`^(?:accepts|requires) (?:at (?:least|most) )?(\d+)(?: arg\(s\)|,)?.*received (\d+)$`)

// friendlyArgs wraps every command's argument check so that a wrong count says what the
// command takes, with its usage line, instead of "accepts 2 arg(s), received 0".
func friendlyArgs(c *cobra.Command) {
	for _, sub := range c.Commands() {
		friendlyArgs(sub)
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
			return fmt.Errorf("%s takes %s, got %d (usage: %s)", cmd.CommandPath(), argNames(cmd), len(args), cmd.UseLine())
		}
		return err
	}
}

// argNames is what a command's usage line says it takes after its name.
func argNames(c *cobra.Command) string {
	_, rest, _ := strings.Cut(c.Use, " ")
	rest = strings.Join(strings.Fields(flagGroups.ReplaceAllString(rest, "")), " ")
	if rest == "" {
		return "no arguments"
	}
	return rest
}
