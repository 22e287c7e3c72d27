//go:build unix

package secretfile

import (
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"github.com/roche-sandbox/roche"
)

// checkOwner refuses a secret file owned by someone other than this process's user or
// root: its owner could change it.
func checkOwner(fi fs.FileInfo, path, what string) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	if uid := int(st.Uid); uid != 0 && uid != os.Geteuid() {
		return fmt.Errorf("%w: %s %s belongs to uid %d, not to this program's user (%d) or root", roche.ErrInvalidConfig, what, path, uid, os.Geteuid())
	}
	return nil
}
