package roche_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
)

// TestMetadataValidated: metadata is bounded, its keys are of a label's charset, and no
// key may be (or pass for) one of Roche's own labels, in any case; each refusal is one
// line naming the key.
func TestMetadataValidated(t *testing.T) {
	ok := []map[string]string{
		nil,
		{"user": "alice", "job-id": "42", "a.b_c": "", "x": strings.Repeat("v", roche.MaxMetadataValueBytes)},
		{"R0che": "not ours: a zero"},
		{strings.Repeat("k", roche.MaxMetadataKeyBytes): "longest key"},
	}
	for _, md := range ok {
		cfg := roche.DefaultConfig()
		cfg.Metadata = md
		if err := cfg.Validate(); err != nil {
			t.Errorf("metadata %v: %v", md, err)
		}
	}
	many := map[string]string{}
	for i := range roche.MaxMetadataPairs + 1 {
		many["k"+strings.Repeat("x", i)] = "v"
	}
	bad := map[string]map[string]string{
		"Roche's own":              {"roche.managed": "false"},
		"Roche's own ":             {"ROCHE.owner": "x"},
		"Roche's own  ":            {"roche": "x"},
		"Roche's own   ":           {"rochex": "x"},
		"use letters":              {"a/b": "x"},
		"use letters ":             {"-a": "x"},
		"use letters  ":            {"a.": "x"},
		"use letters   ":           {"k=v": "x"},
		"give 1 to 63":             {"": "x"},
		"give 1 to 63 ":            {strings.Repeat("k", roche.MaxMetadataKeyBytes+1): "x"},
		"over the limit of 512":    {"k": strings.Repeat("v", roche.MaxMetadataValueBytes+1)},
		"not printable":            {"k": "line\nbreak"},
		"not printable ":           {"k": "\xff"},
		"33 pairs, over the limit": many,
	}
	for want, md := range bad {
		cfg := roche.DefaultConfig()
		cfg.Metadata = md
		err := cfg.Validate()
		if !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), strings.TrimSpace(want)) || strings.Contains(err.Error(), "\n") {
			t.Errorf("metadata %.60v: %v, want one line of invalid config saying %q", md, err, strings.TrimSpace(want))
		}
	}
}

func TestListFilter(t *testing.T) {
	sbs := []roche.SandboxInfo{
		{ID: "a", State: roche.StateRunning, Metadata: map[string]string{"team": "x", "user": "alice"}},
		{ID: "b", State: roche.StatePaused, Metadata: map[string]string{"team": "x"}},
		{ID: "c", State: roche.StateRunning},
	}
	ids := func(f roche.ListFilter) string {
		var out []string
		for _, s := range f.Filter(sbs) {
			out = append(out, s.ID)
		}
		return strings.Join(out, ",")
	}
	for f, want := range map[*roche.ListFilter]string{
		{}: "a,b,c",
		{Metadata: map[string]string{"team": "x"}}:                           "a,b",
		{Metadata: map[string]string{"team": "x", "user": "alice"}}:          "a",
		{Metadata: map[string]string{"team": ""}}:                            "",
		{State: roche.StateRunning}:                                          "a,c",
		{State: roche.StatePaused, Metadata: map[string]string{"team": "x"}}: "b",
	} {
		if got := ids(*f); got != want {
			t.Errorf("%+v kept %q, want %q", *f, got, want)
		}
	}
	for _, f := range []roche.ListFilter{{State: "sleeping"}, {Metadata: map[string]string{"roche.owner": "x"}}} {
		if err := f.Validate(); !errors.Is(err, roche.ErrInvalidConfig) {
			t.Errorf("%+v: %v, want invalid config", f, err)
		}
	}
	for _, d := range []time.Duration{0, time.Second - 1, roche.MaxTimeoutSecs*time.Second + 1} {
		if err := roche.ValidTimeout(d); !errors.Is(err, roche.ErrInvalidConfig) {
			t.Errorf("ValidTimeout(%s): %v", d, err)
		}
	}
	if err := roche.ValidTimeout(roche.MaxTimeoutSecs * time.Second); err != nil {
		t.Errorf("ValidTimeout(24h): %v", err)
	}
}
