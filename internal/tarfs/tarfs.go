// Package tarfs moves files between the host and a sandbox as tar streams, the format
// both the Docker archive API and tar inside a sandbox speak. Extraction never writes
// outside its destination: entries that climb out with "..", absolute names and writes
// through symlinks are refused.
package tarfs

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// Write writes the host file or directory src as a tar stream whose root entry is named
// name.
func Write(w io.Writer, src, name string) error {
	tw := tar.NewWriter(w)
	root := filepath.Clean(src)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		hdr.Name = path.Join(name, filepath.ToSlash(rel))
		if d.IsDir() {
			hdr.Name += "/"
		}
		// Ownership of the host's files means nothing in the sandbox: the extractor's user owns them.
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// Extract reads a tar stream whose entries share one root entry and recreates that root
// at the host path dst (the root's own name is replaced by dst).
func Extract(r io.Reader, dst string) error {
	dst = filepath.Clean(dst)
	tr := tar.NewReader(r)
	seen := false
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			if !seen {
				return errors.New("the archive was empty")
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading archive: %w", err)
		}
		seen = true
		name := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
		if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("archive entry %q points outside the destination", hdr.Name)
		}
		_, rest, _ := strings.Cut(name, "/")
		target := dst
		if rest != "" {
			target = filepath.Join(dst, filepath.FromSlash(rest))
		}
		if err := noSymlinkBetween(dst, target); err != nil {
			return err
		}
		mode := fs.FileMode(hdr.Mode) & fs.ModePerm
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, mode|0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			if err := writeFile(target, tr, mode); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			_ = os.Remove(target)
			if err := os.Symlink(hdr.Linkname, target); err != nil {
				return err
			}
		default:
			// Devices, fifos and hard links are not copied out of a sandbox.
		}
	}
}

func writeFile(target string, r io.Reader, mode fs.FileMode) error {
	// Replace rather than follow whatever is there (it may be a symlink).
	_ = os.Remove(target)
	f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// noSymlinkBetween refuses a target whose parents, below root, include a symlink: writing
// through it could land anywhere on the host.
func noSymlinkBetween(root, target string) error {
	rel, err := filepath.Rel(root, filepath.Dir(target))
	if err != nil || rel == "." {
		return nil
	}
	p := root
	for _, part := range strings.Split(rel, string(filepath.Separator)) {
		p = filepath.Join(p, part)
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("archive entry %s would be written through the symlink %s", target, p)
		}
	}
	return nil
}
