// Package buildinfo says which build a Roche binary is: the one version that roche
// --version, roched --version, roched's /healthz and roche mcp's server report alike.
package buildinfo

import (
	"regexp"
	"runtime/debug"
	"strings"
)

// pseudoVersion is the tail of a module pseudo-version (a commit, not a tag):
// v0.0.0-20261129074500-6cf9765c0e1b, v0.1.1-0.20261129074500-6cf9765c0e1b.
var pseudoVersion = regexp.MustCompile(`[-.]\d{14}-([0-9a-f]{12})$`)

// Release is the version of this source tree. The SDKs' manifests carry it too
// (sdk/python/pyproject.toml, sdk/typescript/package.json); TestReleaseEverywhere keeps
// them equal.
const Release = "0.1.0"

// Version is this build's: the module version when installed with go install of a
// tagged release, else Release marked as a development build with the commit it was
// built from ("0.1.0-devel+6cf9765c0e1b", "+dirty" with uncommitted changes).
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Release + "-devel"
	}
	return version(bi)
}

func version(bi *debug.BuildInfo) string {
	if v := bi.Main.Version; v != "" && v != "(devel)" && !pseudoVersion.MatchString(v) {
		// A tag (v0.1.0); a pseudo-version (v0.0.0-2026...-abcdef) is a commit, below.
		return strings.TrimPrefix(v, "v")
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = ".dirty"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev == "" {
		if m := pseudoVersion.FindStringSubmatch(bi.Main.Version); m != nil {
			return Release + "-devel+" + m[1]
		}
		return Release + "-devel"
	}
	return Release + "-devel+" + rev + dirty
}
