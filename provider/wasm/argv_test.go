package wasm

import (
	"slices"
	"testing"
)

func TestPythonArgv(t *testing.T) {
	for _, c := range []struct{ in, want []string }{
		{[]string{"python3", "script.py", "a"}, []string{"python3", "/w/script.py", "a"}},
		{[]string{"python3", "-u", "-B", "sub/s.py"}, []string{"python3", "-u", "-B", "/w/sub/s.py"}},
		{[]string{"python3", "-uB", "s.py"}, []string{"python3", "-uB", "/w/s.py"}},
		{[]string{"python3", "-W", "ignore", "s.py"}, []string{"python3", "-W", "ignore", "/w/s.py"}},
		{[]string{"python3", "-Wignore", "s.py"}, []string{"python3", "-Wignore", "/w/s.py"}},
		{[]string{"python3", "-X", "dev", "s.py", "x.py"}, []string{"python3", "-X", "dev", "/w/s.py", "x.py"}},
		{[]string{"python3", "--check-hash-based-pycs", "never", "s.py"}, []string{"python3", "--check-hash-based-pycs", "never", "/w/s.py"}},
		{[]string{"python3", "--", "s.py"}, []string{"python3", "--", "/w/s.py"}},
		{[]string{"python3", "-c", "print(1)", "s.py"}, []string{"python3", "-c", "print(1)", "s.py"}},
		{[]string{"python3", "-uc", "print(1)"}, []string{"python3", "-uc", "print(1)"}},
		{[]string{"python3", "-m", "json.tool", "f.json"}, []string{"python3", "-m", "json.tool", "f.json"}},
		{[]string{"python3", "/abs/s.py"}, []string{"python3", "/abs/s.py"}},
		{[]string{"python3", "-"}, []string{"python3", "-"}},
		{[]string{"python3"}, []string{"python3"}},
	} {
		if got := pythonArgv(c.in, "/w"); !slices.Equal(got, c.want) {
			t.Errorf("pythonArgv(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestPythonImage(t *testing.T) {
	for image, want := range map[string]bool{
		"python:3.12-slim": true, "python:3.12": true, "python": true, "python:latest": true,
		"docker.io/library/python:3.12.1-bookworm": true, "localhost:5000/python:3.12": true,
		"python:3.11": false, "python:2": false, "ubuntu:22.04": false, "roche/python:local": false,
		"pythonista:3.12": false, "": false,
	} {
		if got := pythonImage(image); got != want {
			t.Errorf("pythonImage(%q) = %v, want %v", image, got, want)
		}
	}
}
