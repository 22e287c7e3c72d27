//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"
)

// TestCheckedInProfileIsCurrent: the profile provider/internal/seccomp embeds is what
// this generator makes from the module's default profile today. When it fails, Docker's
// default moved (a dependency update): review the change and run go generate
// ./provider/internal/seccomp.
func TestCheckedInProfileIsCurrent(t *testing.T) {
	want, err := Profile()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../seccomp.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("provider/internal/seccomp/seccomp.json differs from the generated profile: run go generate ./provider/internal/seccomp and review the difference")
	}
}

// TestDeniedCallsAreNotAllowed: no rule of the profile allows a denied call, under any
// condition, and the calls every program needs are still allowed.
func TestDeniedCallsAreNotAllowed(t *testing.T) {
	b, err := Profile()
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		DefaultAction string `json:"defaultAction"`
		Syscalls      []struct {
			Names  []string `json:"names"`
			Name   string   `json:"name"` // the old one-name form, which the trimming does not read
			Action string   `json:"action"`
		} `json:"syscalls"`
	}
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	if p.DefaultAction != "SCMP_ACT_ERRNO" {
		t.Fatalf("default action %s, want SCMP_ACT_ERRNO: a call the profile does not name must fail", p.DefaultAction)
	}
	allowed := map[string]bool{}
	for _, r := range p.Syscalls {
		if r.Name != "" {
			t.Errorf("a rule names %s in the old one-name form: Profile would not have trimmed it", r.Name)
		}
		for _, n := range r.Names {
			if r.Action == "SCMP_ACT_ALLOW" {
				allowed[n] = true
			}
		}
	}
	for _, d := range denied {
		if allowed[d.name] {
			t.Errorf("%s is allowed by some rule", d.name)
		}
	}
	for _, n := range []string{"read", "write", "openat", "execve", "clone", "setuid", "inotify_init1", "socket"} {
		if !allowed[n] {
			t.Errorf("%s is not allowed: sandboxed programs need it", n)
		}
	}
}
