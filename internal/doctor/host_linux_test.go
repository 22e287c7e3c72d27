package doctor

import (
	"errors"
	"testing"
)

// TestUserNamespaces: the user-namespace finding from the sysctls, off either way with
// the sysctl that turns them on, and optional (the providers run as root).
func TestUserNamespaces(t *testing.T) {
	for _, c := range []struct {
		max, clone string
		ok         bool
		fix        string
	}{
		{"15000", "", true, ""},
		{"15000", "1", true, ""},
		{"0", "", false, "sysctl -w user.max_user_namespaces=15000"},
		{"15000", "0", false, "sysctl -w kernel.unprivileged_userns_clone=1"},
	} {
		f := userNamespaces(func(path string) (string, error) {
			switch path {
			case "/proc/sys/user/max_user_namespaces":
				return c.max, nil
			case "/proc/sys/kernel/unprivileged_userns_clone":
				if c.clone != "" {
					return c.clone, nil
				}
			}
			return "", errors.New("no such file")
		})
		if f.OK != c.ok || f.Fix != c.fix || !f.Optional || (f.Fix != "" && !f.AsRoot) {
			t.Errorf("max %q, clone %q: %+v, want ok %v, fix %q as root, optional", c.max, c.clone, f, c.ok, c.fix)
		}
	}
}
