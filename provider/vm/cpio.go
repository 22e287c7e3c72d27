package vm

import (
	"fmt"
	"io"
	"io/fs"
)

// cpioWriter writes the "newc" cpio format the kernel unpacks as an initramfs. Only what
// an initramfs needs: directories, regular files, character devices. Archives may be
// concatenated; the kernel unpacks them in turn (which is how each VM's config is
// appended to the shared, cached initramfs without copying it through a rebuild).
type cpioWriter struct {
	w   io.Writer
	off int64
	ino uint32
	err error
}

func newCPIOWriter(w io.Writer) *cpioWriter { return &cpioWriter{w: w, ino: 1} }

func (c *cpioWriter) write(p []byte) {
	if c.err != nil {
		return
	}
	n, err := c.w.Write(p)
	c.off += int64(n)
	c.err = err
}

func (c *cpioWriter) pad() {
	if r := c.off % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

// header writes one entry's header and name; mode includes the file type bits.
func (c *cpioWriter) header(name string, mode uint32, size int64, rdevMajor, rdevMinor uint32) {
	if size > 0xffffffff {
		c.err = fmt.Errorf("%s: %d bytes is too large for a cpio archive", name, size)
		return
	}
	c.ino++
	hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		c.ino, mode, 0, 0, 1, 0, size, 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write(append([]byte(name), 0))
	c.pad()
}

const (
	cpioDir  = 0o040000
	cpioReg  = 0o100000
	cpioChar = 0o020000
)

func (c *cpioWriter) Dir(name string, perm fs.FileMode) {
	c.header(name, cpioDir|uint32(perm.Perm()), 0, 0, 0)
}

func (c *cpioWriter) File(name string, perm fs.FileMode, data []byte) {
	c.header(name, cpioReg|uint32(perm.Perm()), int64(len(data)), 0, 0)
	c.write(data)
	c.pad()
}

// FileFrom copies size bytes of r as a regular file.
func (c *cpioWriter) FileFrom(name string, perm fs.FileMode, r io.Reader, size int64) {
	c.header(name, cpioReg|uint32(perm.Perm()), size, 0, 0)
	if c.err != nil {
		return
	}
	n, err := io.CopyN(c.w, r, size)
	c.off += n
	if err != nil {
		c.err = fmt.Errorf("%s: %w", name, err)
		return
	}
	c.pad()
}

func (c *cpioWriter) CharDev(name string, perm fs.FileMode, major, minor uint32) {
	c.header(name, cpioChar|uint32(perm.Perm()), 0, major, minor)
}

// Close writes the trailer; it does not close the underlying writer.
func (c *cpioWriter) Close() error {
	c.header("TRAILER!!!", 0, 0, 0, 0)
	return c.err
}
