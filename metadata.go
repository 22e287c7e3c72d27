package roche

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Labels and lifetimes: metadata a caller attaches to a sandbox at create (Config.Metadata,
// returned as SandboxInfo.Metadata and filtered on by ListFilter), and a lifetime changed
// after the create (LifetimeSetter).

// Bounds of Config.Metadata: its pairs, a key's and a value's bytes.
const (
	MaxMetadataPairs      = 32
	MaxMetadataKeyBytes   = 63
	MaxMetadataValueBytes = 512
)

// ReservedMetadataPrefix starts the names of Roche's own labels and annotations
// (roche.managed, roche.owner, roche.expires, ...): no metadata key may start with it,
// in any case, so metadata can never be taken for, or stored over, one of them.
const ReservedMetadataPrefix = "roche"

// metadataProblems checks Config.Metadata: bounded, keys of a label's charset (letters,
// digits, '_', '.' and '-', starting and ending with a letter or digit, so that every
// provider can keep them as labels or annotations), none of Roche's own, and values of
// printable UTF-8.
func metadataProblems(md map[string]string) []string {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if len(md) > MaxMetadataPairs {
		add("metadata has %d pairs, over the limit of %d", len(md), MaxMetadataPairs)
	}
	for _, k := range slices.Sorted(maps.Keys(md)) {
		if p := metadataKeyProblem(k); p != "" {
			add("%s", p)
			continue
		}
		v := md[k]
		switch {
		case len(v) > MaxMetadataValueBytes:
			add("metadata %s is %d bytes, over the limit of %d", k, len(v), MaxMetadataValueBytes)
		case !utf8.ValidString(v) || strings.IndexFunc(v, unicode.IsControl) >= 0:
			add("metadata %s is not printable UTF-8: give text without control characters", k)
		}
	}
	return problems
}

// metadataKeyProblem says what is wrong with a metadata key, "" when nothing is.
func metadataKeyProblem(k string) string {
	if k == "" || len(k) > MaxMetadataKeyBytes {
		return fmt.Sprintf("metadata key %.80q: give 1 to %d characters", k, MaxMetadataKeyBytes)
	}
	for i, r := range k {
		alnum := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
		if !alnum && (i == 0 || i == len(k)-1 || r != '_' && r != '.' && r != '-') {
			return fmt.Sprintf("metadata key %q: use letters, digits, '_', '.' and '-', starting and ending with a letter or digit", k)
		}
	}
	if strings.HasPrefix(strings.ToLower(k), ReservedMetadataPrefix) {
		return fmt.Sprintf("metadata key %q: keys starting with %q are Roche's own: choose another name", k, ReservedMetadataPrefix)
	}
	return ""
}

// ListFilter selects sandboxes from a list: those whose metadata has every pair of
// Metadata, and, when State is set, in that state. The zero filter keeps every one.
type ListFilter struct {
	Metadata map[string]string
	State    SandboxState
}

// Validate refuses a filter no sandbox could match for a reason the caller should hear:
// a state that is not one, or a key no metadata can have.
func (f ListFilter) Validate() error {
	var problems []string
	switch f.State {
	case "", StateRunning, StatePaused, StateExited, StateCreated:
	default:
		problems = append(problems, fmt.Sprintf("state %q: give running, paused, exited or created", f.State))
	}
	if len(f.Metadata) > MaxMetadataPairs {
		problems = append(problems, fmt.Sprintf("metadata filter has %d pairs, over the limit of %d", len(f.Metadata), MaxMetadataPairs))
	}
	for _, k := range slices.Sorted(maps.Keys(f.Metadata)) {
		if p := metadataKeyProblem(k); p != "" {
			problems = append(problems, p)
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrInvalidConfig, strings.Join(problems, "; "))
}

// Match reports whether the filter keeps s.
func (f ListFilter) Match(s SandboxInfo) bool {
	if f.State != "" && s.State != f.State {
		return false
	}
	for k, v := range f.Metadata {
		if got, ok := s.Metadata[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Filter returns the sandboxes of list the filter keeps, in their order.
func (f ListFilter) Filter(list []SandboxInfo) []SandboxInfo {
	if f.State == "" && len(f.Metadata) == 0 {
		return list
	}
	out := make([]SandboxInfo, 0, len(list))
	for _, s := range list {
		if f.Match(s) {
			out = append(out, s)
		}
	}
	return out
}

// LifetimeSetter changes a sandbox's lifetime after its create: implemented by the
// providers whose sandboxes can be told a new end.
type LifetimeSetter interface {
	// SetTimeout makes the sandbox end d from now, sooner or later than it was to, and
	// returns it with its new ExpiresAt. d is 1 s to MaxTimeoutSecs (ValidTimeout); the
	// new end is both what Inspect reports and what ends the sandbox.
	SetTimeout(ctx context.Context, id string, d time.Duration) (SandboxInfo, error)
}

// ValidTimeout checks a lifetime given to SetTimeout: a whole number of seconds, at
// least one, at most MaxTimeoutSecs.
func ValidTimeout(d time.Duration) error {
	switch {
	case d < time.Second:
		return fmt.Errorf("%w: timeout %s: give at least 1 s", ErrInvalidConfig, d)
	case d > MaxTimeoutSecs*time.Second:
		return fmt.Errorf("%w: timeout %s is over the limit of %d s (24 h)", ErrInvalidConfig, d, MaxTimeoutSecs)
	}
	return nil
}
