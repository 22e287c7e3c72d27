package ledger

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche"
)

// layoutProvider is the little of a provider permitImage asks: its name, and whether it
// pins layouts.
type layoutProvider struct {
	roche.Provider
	pins bool
}

func (layoutProvider) Name() string        { return "oci" }
func (p layoutProvider) PinsLayouts() bool { return p.pins }

// TestPermitImage: the string rules for images from host paths (internal/daemon's
// TestTenantHostPaths attacks them through roched). A TCP tenant names only canonical
// paths at or below its roots, through a provider that pins layouts; the answer for
// one outside never depends on the file system. The local tenant names any, its links
// resolved; an image that names no host path is left alone.
func TestPermitImage(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	os.Mkdir(root, 0o755)
	os.Symlink(root, filepath.Join(dir, "link"))
	acme := &Tenant{Name: "acme", MountRoots: []string{root}}
	pinned := layoutProvider{pins: true}

	for _, c := range []struct {
		t     *Tenant
		p     roche.Provider
		image string
		want  string // the image to make, or the error's sentinel and text
		err   error
	}{
		{acme, pinned, "roche/python:local", "roche/python:local", nil},
		{acme, pinned, LayoutPrefix + root + "/py", LayoutPrefix + root + "/py", nil},
		{acme, pinned, LayoutPrefix + root + "/py@sha256:ab", LayoutPrefix + root + "/py@sha256:ab", nil},
		{acme, pinned, LayoutPrefix + "/etc", "is not at or below a directory tenant acme may use", roche.ErrPermission},
		{acme, pinned, LayoutPrefix + root + "/../etc", "is not at or below", roche.ErrPermission},
		{acme, pinned, LayoutPrefix + root + "x/py", "is not at or below", roche.ErrPermission},
		{acme, pinned, LayoutPrefix + "py", "is not at or below", roche.ErrPermission},
		{acme, pinned, LayoutPrefix + root + "/py/", "is not at or below", roche.ErrPermission},
		{&Tenant{Name: "bolt"}, pinned, LayoutPrefix + root, "tenant bolt may not use images from host paths", roche.ErrPermission},
		{acme, layoutProvider{}, LayoutPrefix + root + "/py", "the oci provider does not read image layouts pinned against links", roche.ErrUnsupported},
		{&Tenant{Name: LocalTenant, Local: true}, layoutProvider{}, LayoutPrefix + dir + "/link/py@sha256:ab", LayoutPrefix + dir + "/link/py@sha256:ab", nil},
		{&Tenant{Name: LocalTenant, Local: true}, layoutProvider{}, LayoutPrefix + dir + "/link", LayoutPrefix + root, nil},
	} {
		got, err := permitImage(c.t, c.p, c.image)
		switch {
		case c.err == nil && (err != nil || got != c.want):
			t.Errorf("%s for %s: %q, %v; want %q", c.image, c.t.Name, got, err, c.want)
		case c.err != nil && (!errors.Is(err, c.err) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s for %s: %v; want %v saying %q", c.image, c.t.Name, err, c.err, c.want)
		}
	}
}
