package cli

import (
	"errors"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/wire"
)

// exitIncomplete is the exit status of a list or count across providers that skipped one
// set up but unavailable (an engine that hangs or refuses): what it printed lacks that
// provider's part, and a script must not read it as the whole. stderr says which
// (roche: incomplete: skipped ...), and a list's JSON does too (printListJSON).
const exitIncomplete = 3

// skippedJSON names a provider a list skipped, in its JSON and in the JSON error line.
type skippedJSON struct {
	Provider string `json:"provider"`
	Reason   string `json:"reason"`
	Message  string `json:"message"`
}

// skippedOf is what err, a *roche.PartialError, says was skipped, or nil.
func skippedOf(err error) []skippedJSON {
	var pe *roche.PartialError
	if !errors.As(err, &pe) {
		return nil
	}
	out := make([]skippedJSON, 0, len(pe.Skipped))
	for _, s := range pe.Skipped {
		out = append(out, skippedJSON{Provider: s.Provider, Reason: wire.Reason(s.Err), Message: oneLine(s.Err)})
	}
	return out
}

// printListJSON prints a list gathered across providers, whose gathering ended with err.
// Complete, it is the JSON array as ever; when providers were skipped it is an object,
// {key: the array, "skipped": [...]}, so that a reader taking the array for the whole
// list fails rather than reading "nothing there". It returns err for the exit status.
func (e *env) printListJSON(key string, list any, err error) error {
	skipped := skippedOf(err)
	if skipped == nil {
		if perr := e.printJSON(list); perr != nil {
			return perr
		}
		return err
	}
	if perr := e.printJSON(map[string]any{key: list, "skipped": skipped}); perr != nil {
		return perr
	}
	return err
}

// partial reports whether err is a list's or count's incompleteness alone, after which
// the command still prints what it gathered.
func partial(err error) bool {
	var pe *roche.PartialError
	return errors.As(err, &pe)
}
