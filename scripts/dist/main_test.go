package main

import (
	"archive/zip"
	"crypto/sha256"
	"encoding/base64"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestWheelIsWhatPipReads: every file of the wheel is in RECORD with its sha256 and
// size, RECORD names itself, the binaries keep their executable bits, and METADATA and
// WHEEL carry the name, version and tag pip checks. (The install itself, into a fresh
// venv, is sdk/python/tests/test_install.py.)
func TestWheelIsWhatPipReads(t *testing.T) {
	if err := os.Chdir("../.."); err != nil {
		t.Fatal(err)
	}
	meta, err := readProject(filepath.Join(sdkDir, "pyproject.toml"))
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	for _, b := range binaries {
		if err := os.WriteFile(filepath.Join(bin, b), []byte("#!/bin/sh\necho "+b+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	name := filepath.Join(t.TempDir(), "w.whl")
	if err := writeWheel(name, meta, platforms["amd64"], bin); err != nil {
		t.Fatal(err)
	}
	z, err := zip.OpenReader(name)
	if err != nil {
		t.Fatal(err)
	}
	defer z.Close()
	info := "roche_sandbox-" + meta.version + ".dist-info/"
	contents := map[string][]byte{}
	for _, f := range z.File {
		r, err := f.Open()
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(r)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		contents[f.Name] = b
		exec := f.Mode()&0o111 != 0
		if strings.HasPrefix(f.Name, "roche_sandbox/_bin/") != exec {
			t.Errorf("%s: mode %v", f.Name, f.Mode())
		}
	}
	record := strings.Split(strings.TrimSpace(string(contents[info+"RECORD"])), "\n")
	if len(record) != len(contents) {
		t.Fatalf("RECORD has %d lines for %d files", len(record), len(contents))
	}
	for _, line := range record {
		parts := strings.Split(line, ",")
		data, ok := contents[parts[0]]
		if !ok || len(parts) != 3 {
			t.Fatalf("RECORD line %q", line)
		}
		if parts[0] == info+"RECORD" {
			if parts[1] != "" || parts[2] != "" {
				t.Errorf("RECORD's own line: %q", line)
			}
			continue
		}
		sum := sha256.Sum256(data)
		if parts[1] != "sha256="+base64.RawURLEncoding.EncodeToString(sum[:]) || parts[2] != strconv.Itoa(len(data)) {
			t.Errorf("RECORD line %q does not match the file (%d bytes)", line, len(data))
		}
	}
	// roche beside roched and roche-run: the thin roche hands what needs a provider in
	// its own process to them, which it finds beside itself.
	for _, want := range []string{"roche_sandbox/__init__.py", "roche_sandbox/py.typed", "roche_sandbox/_bin/roche", "roche_sandbox/_bin/roched", "roche_sandbox/_bin/roche-run", "roche_sandbox/_bin/roche-agent"} {
		if _, ok := contents[want]; !ok {
			t.Errorf("the wheel lacks %s", want)
		}
	}
	if m := string(contents[info+"METADATA"]); !strings.HasPrefix(m, "Metadata-Version: 2.1\nName: roche-sandbox\nVersion: "+meta.version+"\n") {
		t.Errorf("METADATA: %.200q", m)
	}
	if w := string(contents[info+"WHEEL"]); !strings.Contains(w, "Tag: py3-none-manylinux_2_17_x86_64\n") || !strings.Contains(w, "Root-Is-Purelib: false\n") {
		t.Errorf("WHEEL: %q", w)
	}
}
