package wasm

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

// mountPoint is one directory of the sandbox's file system: a guest path backed by a
// host directory.
type mountPoint struct {
	guest    string // clean absolute guest path
	host     string // absolute host directory without symlinks
	readOnly bool
	own      bool  // one of the sandbox's own directories (not a host mount)
	limit    int64 // bytes an own writable directory may hold (see quota); 0 is none
	// files is the sandbox's cap on open files, the same for all its directories.
	files *openFiles
}

// sandboxMounts lays out the file system of sandbox id: its own root, /tmp and
// /workspace (the named workspace instead when cfg has one), then the host mounts of cfg.
func (p *Provider) sandboxMounts(id string, cfg kit.Spec) ([]mountPoint, error) {
	root := filepath.Join(p.sandboxDir(id), rootDir)
	workspace := filepath.Join(root, "workspace")
	workspaceLimit := int64(roche.DefaultTmpSize)
	if cfg.Workspace != "" {
		size, err := p.workspaceSize(cfg.Workspace)
		if err != nil {
			return nil, err
		}
		workspaceLimit = size
		files := p.workspaceFiles(cfg.Workspace)
		host, err := filepath.EvalSymlinks(files)
		if err == nil {
			var fi os.FileInfo
			if fi, err = os.Stat(host); err == nil && !fi.IsDir() {
				err = fmt.Errorf("%s is not a directory", host)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%w: workspace %s is gone (%v): destroy the sandbox and create it again", roche.ErrNotFound, cfg.Workspace, err)
		}
		workspace = host
	}
	// Each of the sandbox's own writable directories has a bound: the root its disk
	// limit (0: none, as asked), /tmp the tmpfs size Docker gives it, the sandbox's own
	// /workspace the same, a named workspace its size, so that a guest cannot fill the
	// disk of the state or data directory.
	files := p.openFilesOf(id)
	mounts := []mountPoint{
		{guest: "/", host: root, readOnly: !cfg.Writable, own: true, limit: cfg.DiskBytes(), files: files},
		{guest: GuestTmp, host: filepath.Join(root, "tmp"), own: true, limit: roche.DefaultTmpSize, files: files},
		{guest: GuestWorkspace, host: workspace, own: true, limit: workspaceLimit, files: files},
	}
	for _, m := range cfg.Mounts {
		// Resolved now, so that the directory the guest gets is the one named, even if
		// a symlink on the way is changed while it runs.
		host, err := filepath.EvalSymlinks(m.Source)
		if err != nil {
			return nil, fmt.Errorf("%w: mount source %s: %v", roche.ErrInvalidConfig, m.Source, err)
		}
		if fi, err := os.Stat(host); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("%w: mount source %s is not a directory", roche.ErrInvalidConfig, m.Source)
		}
		mounts = append(mounts, mountPoint{guest: path.Clean(m.Target), host: host, readOnly: !m.ReadWrite, files: files})
	}
	return mounts, nil
}

// openFilesOf is sandbox id's cap on open files in this process, made on first use and
// dropped when the sandbox is destroyed here.
func (p *Provider) openFilesOf(id string) *openFiles {
	p.runMu.Lock()
	defer p.runMu.Unlock()
	o := p.openFiles[id]
	if o == nil {
		o = &openFiles{limit: roche.DefaultOpenFiles}
		if p.openFiles == nil {
			p.openFiles = map[string]*openFiles{}
		}
		p.openFiles[id] = o
	}
	return o
}

// resolve finds the mount holding the guest path p (clean and absolute) and p's path
// relative to it ("" for the mount point itself), as WASI libc does: the longest
// mount path that p is at or below wins.
func resolve(mounts []mountPoint, p string) (mountPoint, string) {
	best := -1
	for i, m := range mounts {
		if within(p, m.guest) && (best < 0 || len(m.guest) > len(mounts[best].guest)) {
			best = i
		}
	}
	m := mounts[best] // "/" is always there
	rel := strings.TrimPrefix(strings.TrimPrefix(p, m.guest), "/")
	return m, rel
}

// statIn stats rel inside the host directory dir without following any symlink out of
// it, as the guest would see it.
func statIn(dir, rel string) (fs.FileInfo, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	if rel == "" {
		rel = "."
	}
	return r.Stat(rel)
}

// guestPath makes p absolute against workdir and cleans it.
func guestPath(p, workdir string) string {
	if !path.IsAbs(p) {
		p = path.Join(workdir, p)
	}
	return path.Clean(p)
}
