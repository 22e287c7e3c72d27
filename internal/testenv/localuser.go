package testenv

import (
	"crypto/rand"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"testing"
)

// LocalUser makes an unprivileged local user for the test (a system account, no home,
// no login shell), named prefix and a random suffix, and removes it when the test
// ends: the second local user of the attacks on the host boundary. Needs root.
func LocalUser(t testing.TB, prefix string) (name string, uid, gid int) {
	t.Helper()
	name = prefix + strings.ToLower(rand.Text()[:8])
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd %s (the test needs root): %v %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v %s", name, err, out)
		}
	})
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	return name, uid, gid
}
