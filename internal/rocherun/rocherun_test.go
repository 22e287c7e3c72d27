package rocherun_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche/internal/catalog"
	"github.com/roche-sandbox/roche/internal/rocherun"
)

// TestOneShot: the provider of a one-shot roche run, read as the command line and the
// environment give it, and "" for anything that is not one.
func TestOneShot(t *testing.T) {
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	for _, c := range []struct {
		args []string
		env  func(string) string
		want string
	}{
		{[]string{"run", "--", "true"}, env(), "docker"},
		{[]string{"run", "--provider", "oci", "--", "true"}, env(), "oci"},
		{[]string{"run", "--provider=wasm", "--image", "x", "--", "python3"}, env(), "wasm"},
		{[]string{"run", "--provider", "oci", "--provider", "qemu", "--", "true"}, env(), "qemu"},
		{[]string{"run", "--", "sh", "--provider", "oci"}, env(), "docker"}, // the command's own
		{[]string{"run", "--", "true"}, env("ROCHE_PROVIDER", "oci"), "oci"},
		{[]string{"run", "--provider", "wasm", "--", "true"}, env("ROCHE_PROVIDER", "oci"), "wasm"},
		{[]string{"run", "--provider"}, env(), ""},
		{[]string{"run", "--help"}, env(), ""},
		{[]string{"run", "-h"}, env(), ""},
		{[]string{"run", "--socket", "/s", "--", "true"}, env(), ""},
		{[]string{"run", "--address=http://127.0.0.1:1", "--", "true"}, env(), ""},
		{[]string{"--direct", "run", "--", "true"}, env(), ""},
		{[]string{"exec", "--sandbox", "x", "--", "true"}, env(), ""},
		{nil, env(), ""},
	} {
		if got := rocherun.OneShot(c.args, c.env); got != c.want {
			t.Errorf("rocherun.OneShot(%q) = %q, want %q", c.args, got, c.want)
		}
	}
}

// TestInProcess: a one-shot run on one of roche-run's providers is made in roche-run's
// own process when no roched is there to take it (no ROCHE_ADDRESS or --address, no
// file at roched's socket, named by ROCHE_SOCKET or the standard one), and "" otherwise.
func TestInProcess(t *testing.T) {
	dir := t.TempDir()
	socket := filepath.Join(dir, "roched.sock")
	xdg := filepath.Join(dir, "xdg")
	standard := filepath.Join(xdg, "roche", "roched.sock")
	if err := os.MkdirAll(filepath.Dir(standard), 0o700); err != nil {
		t.Fatal(err)
	}
	oci := []string{"run", "--provider", "oci", "--", "true"}
	for _, c := range []struct {
		name  string
		args  []string
		env   map[string]string
		there string // a file made at this path first
		want  string
	}{
		{"no roched", oci, map[string]string{"ROCHE_SOCKET": socket}, "", "oci"},
		{"the default provider", []string{"run", "--", "true"}, map[string]string{"ROCHE_SOCKET": socket}, "", "docker"},
		{"ROCHE_DEBUG, which changes no way", oci, map[string]string{"ROCHE_SOCKET": socket, "ROCHE_DEBUG": "1"}, "", "oci"},
		{"no roched at the standard socket", oci, map[string]string{"XDG_RUNTIME_DIR": xdg}, "", "oci"},
		{"roched's socket there", oci, map[string]string{"ROCHE_SOCKET": socket}, socket, ""},
		{"roched's standard socket there", oci, map[string]string{"XDG_RUNTIME_DIR": xdg}, standard, ""},
		{"ROCHE_ADDRESS", oci, map[string]string{"ROCHE_SOCKET": socket, "ROCHE_ADDRESS": "http://127.0.0.1:1"}, "", ""},
		{"--address", []string{"run", "--address", "http://127.0.0.1:1", "--provider", "oci", "--", "true"}, map[string]string{"ROCHE_SOCKET": socket}, "", ""},
		{"a provider roche-run lacks", []string{"run", "--provider", "qemu", "--", "true"}, map[string]string{"ROCHE_SOCKET": socket}, "", ""},
		{"not a run", []string{"list"}, map[string]string{"ROCHE_SOCKET": socket}, "", ""},
	} {
		if c.there != "" {
			if err := os.WriteFile(c.there, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if got := rocherun.InProcess(c.args, func(k string) string { return c.env[k] }); got != c.want {
			t.Errorf("%s: InProcess(%q) = %q, want %q", c.name, c.args, got, c.want)
		}
		if c.there != "" {
			if err := os.Remove(c.there); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestEarly: the thin roche hands a one-shot run on one of roche-run's providers to the
// roche-run beside it when no roched's socket is there, and takes the usual way
// otherwise.
func TestEarly(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(dir, "roche")
	run := filepath.Join(dir, rocherun.Name)
	for _, f := range []string{self, run} {
		if err := os.WriteFile(f, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	socket := filepath.Join(dir, "roched.sock")
	vars := map[string]string{"ROCHE_SOCKET": socket}
	getenv := func(k string) string { return vars[k] }
	executable := func() (string, error) { return self, nil }
	oci := []string{"run", "--provider", "oci", "--", "true"}

	if got, ok := rocherun.Early(oci, getenv, executable); !ok || got != run {
		t.Fatalf("no roched, roche-run beside roche: Early = %q, %v; want %q", got, ok, run)
	}
	for _, c := range []struct {
		name string
		args []string
		set  func() func()
	}{
		{"a provider roche-run lacks", []string{"run", "--provider", "qemu", "--", "true"}, nil},
		{"not a run", []string{"list"}, nil},
		{"roched's socket there", oci, func() func() {
			if err := os.WriteFile(socket, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return func() { os.Remove(socket) }
		}},
		{"ROCHE_DEBUG", oci, func() func() { vars["ROCHE_DEBUG"] = "1"; return func() { delete(vars, "ROCHE_DEBUG") } }},
		{"ROCHE_ADDRESS", oci, func() func() {
			vars["ROCHE_ADDRESS"] = "http://127.0.0.1:1"
			return func() { delete(vars, "ROCHE_ADDRESS") }
		}},
		{"no roche-run", oci, func() func() {
			if err := os.Rename(run, run+".away"); err != nil {
				t.Fatal(err)
			}
			return func() { os.Rename(run+".away", run) }
		}},
		{"roche-run is roche", oci, func() func() {
			os.Rename(run, run+".away")
			if err := os.Link(self, run); err != nil {
				t.Fatal(err)
			}
			return func() { os.Remove(run); os.Rename(run+".away", run) }
		}},
		{"no executable", oci, func() func() {
			executable = func() (string, error) { return "", errors.New("unknown") }
			return func() { executable = func() (string, error) { return self, nil } }
		}},
	} {
		undo := func() {}
		if c.set != nil {
			undo = c.set()
		}
		if got, ok := rocherun.Early(c.args, getenv, executable); ok {
			t.Errorf("%s: Early = %q, want the usual way", c.name, got)
		}
		undo()
	}
	if _, ok := rocherun.Early(oci, getenv, executable); !ok {
		t.Fatal("the cases did not put things back")
	}
}

// TestEarlyMatchesCatalog: the thin roche's early reading names the default provider the
// catalog does, and Direct is sorted (that roche-run links exactly Direct is
// internal/inproc/direct's TestConstructorsAreDirect).
func TestEarlyMatchesCatalog(t *testing.T) {
	if !slices.IsSorted(rocherun.Direct) {
		t.Errorf("Direct %v is not sorted", rocherun.Direct)
	}
	if got := rocherun.OneShot([]string{"run", "--", "true"}, func(string) string { return "" }); got != catalog.Default {
		t.Errorf("default provider %q, catalog.Default %q", got, catalog.Default)
	}
}

// TestStandardSocket: roched's socket under XDG_RUNTIME_DIR, else the home, else a
// per-user directory of the temp dir, a trailing slash of either making no second one.
func TestStandardSocket(t *testing.T) {
	tmp := fmt.Sprintf("%s/roche-%d/roched.sock", strings.TrimSuffix(os.TempDir(), "/"), os.Getuid())
	for _, c := range []struct{ xdg, home, want string }{
		{"/run/user/1000", "", "/run/user/1000/roche/roched.sock"},
		{"/run/user/1000/", "/home/someone", "/run/user/1000/roche/roched.sock"},
		{"", "/home/someone", "/home/someone/.roche/roched.sock"},
		{"", "/home/someone/", "/home/someone/.roche/roched.sock"},
		{"", "", tmp},
	} {
		t.Setenv("XDG_RUNTIME_DIR", c.xdg)
		t.Setenv("HOME", c.home)
		if got := rocherun.StandardSocket(os.Getenv); got != c.want {
			t.Errorf("XDG_RUNTIME_DIR=%q HOME=%q: %q, want %q", c.xdg, c.home, got, c.want)
		}
	}
}
