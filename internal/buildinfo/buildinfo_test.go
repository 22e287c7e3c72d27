package buildinfo

import (
	"encoding/json"
	"os"
	"regexp"
	"runtime/debug"
	"testing"
)

// TestReleaseEverywhere: the SDKs' manifests carry Release, so that pip, npm, roche
// --version and roched's /healthz name the same version.
func TestReleaseEverywhere(t *testing.T) {
	for file, pattern := range map[string]string{
		"../../sdk/python/pyproject.toml":                `(?m)^version = "([^"]+)"$`,
		"../../sdk/python/src/roche_sandbox/__init__.py": `(?m)^__version__ = "([^"]+)"$`,
		"../../sdk/typescript/package.json":              `(?m)^  "version": "([^"]+)",$`,
		"../../sdk/typescript/package-lock.json":         `(?m)^  "version": "([^"]+)",$`,
	} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(pattern).FindSubmatch(b)
		if m == nil || string(m[1]) != Release {
			t.Errorf("%s: version %q, want %s (buildinfo.Release)", file, m, Release)
		}
	}
	var pkg struct{ Version string }
	b, _ := os.ReadFile("../../sdk/typescript/package.json")
	if json.Unmarshal(b, &pkg) != nil || pkg.Version != Release {
		t.Errorf("package.json's version %q, want %s", pkg.Version, Release)
	}
}

func TestVersionOfBuilds(t *testing.T) {
	for _, c := range []struct {
		bi   debug.BuildInfo
		want string
	}{
		{debug.BuildInfo{Main: debug.Module{Version: "v0.1.0"}}, "0.1.0"},
		{debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, Release + "-devel"},
		{debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "6cf9765c0e1b0123456789"}, {Key: "vcs.modified", Value: "true"}}}, Release + "-devel+6cf9765c0e1b.dirty"},
		{debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261129074500-6cf9765c0e1b"}}, Release + "-devel+6cf9765c0e1b"},
	} {
		if got := version(&c.bi); got != c.want {
			t.Errorf("version of %+v = %q, want %q", c.bi.Main, got, c.want)
		}
	}
}
