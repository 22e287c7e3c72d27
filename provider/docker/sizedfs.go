package docker

// MountSizedFS makes img, a sparse file holding an empty ext4 filesystem of size bytes
// without a journal, and loop-mounts it at dir: the filesystem Docker's writable roots
// live on (disk_linux.go), offered to the OCI provider so that both bound a writable root
// the same way. It fails if img exists. UnmountSizedFS undoes it.
func MountSizedFS(img, dir string, size int64) error {
	if err := canMount(); err != nil {
		return err
	}
	if err := makeExt4(img, size, layerFS); err != nil {
		return err
	}
	if err := mountImage(img, dir); err != nil {
		return err
	}
	return nil
}

// UnmountSizedFS unmounts dir (which releases its loop device); busy reports a
// filesystem still in use. Unmounting what is not mounted is not an error.
func UnmountSizedFS(dir string) (busy bool, err error) { return unmount(dir) }
