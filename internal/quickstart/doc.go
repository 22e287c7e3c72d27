// Package quickstart holds TestQuickStarts, which runs the README's quick starts as
// written: the README cannot drift from the code without make test saying so.
package quickstart
