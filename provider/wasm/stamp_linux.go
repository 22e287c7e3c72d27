package wasm

import (
	"fmt"
	"os"
	"syscall"
)

// fileStamp names one version of a file: its device and inode (another file put in its
// place differs), size, mtime and ctime (which only the kernel sets, to now, on every
// change to the file, its mode or its owner); "" when fi does not say.
func fileStamp(fi os.FileInfo) string {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return ""
	}
	return fmt.Sprintf("%d:%d:%d:%d.%d:%d.%d", st.Dev, st.Ino, st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec)
}
