// Package wasm runs Roche sandboxes as WebAssembly: WASI preview1 command modules on
// wazero (pure Go, no cgo, no kernel features needed). The interpreter is CPython 3.12
// built for WASI (python.wasm, fetched by roche image build python --provider wasm), so
// exec(["python3", "-c", code]) works as it does in the Docker provider, and a .wasm
// module inside the sandbox can be run directly. Nothing else can be run: there is no
// shell and there are no other programs.
//
// What a sandbox is here. A module may import nothing but wasi_snapshot_preview1, and
// is given no sockets, so it has no network, no processes and no other host functions.
// It sees only the directories it is given, each confined so that neither "../" nor a
// symbolic link leads out (guests cannot create symbolic links at all):
//
//	/              an empty per-sandbox directory, read-only unless Config.Writable
//	/tmp           per-sandbox scratch space, writable
//	/workspace     per-sandbox working space (or the named Config.Workspace), writable;
//	               Python starts here by default
//	Config.Mounts  host directories, read-only unless ReadWrite
//
// Each of the sandbox's own writable directories has a byte quota: a writable root
// Config.Disk, /tmp (and the sandbox's own /workspace) roche.DefaultTmpSize as the Docker
// provider's /tmp tmpfs, a named workspace its size. A write past it fails with ENOSPC,
// and so does a create past its entries (one per KiB of it: 65,536 in /tmp), since an
// empty file costs a host inode. The files a sandbox's guests hold open are the
// provider process's own descriptors: at most roche.DefaultOpenFiles (1024) per
// sandbox, past which an open fails with EMFILE. Python's standard library is packed inside python.wasm (by
// wasi-vfs) and appears under /usr, served from the module's own memory.
//
// Results. Linear memory is capped at Config.Memory: a program that asks for more is
// refused it (Python raises MemoryError), and if it then fails the result says
// OOMKilled. A timeout stops guest code, running or sleeping, and reports TimedOut with
// exit code 137, as a killed process would. A module that traps (unreachable, an
// out-of-bounds access; also how WASI libc's abort() ends) exits 134 with the trap and
// a short wasm stack trace appended to stderr.
//
// Persistence. Config.Workspace mounts a named directory under the data directory at
// /workspace instead of the sandbox's own, so that it outlives the sandbox (capped at its
// size, fixed when it is made). A snapshot copies the sandbox's own files (its
// root when writable, /tmp, and /workspace unless it is a named workspace) under the data
// directory; Config.FromSnapshot starts a sandbox with a copy of them. Reset makes the
// sandbox again from its record. See workspace.go and snapshot.go.
//
// A sandbox is a directory under the state directory holding a small JSON record, so
// one process (a CLI invocation) can create a sandbox and a later one exec in it. Each
// exec runs on an instance of its own (about 0.1 s to instantiate python.wasm and
// initialise CPython), so nothing of one exec's memory reaches the next; files do. A
// long-lived process (roched) can have that instance started ahead of the exec, in the
// background (WithWarmStart, warm.go). Compiling python.wasm takes seconds, so the
// compiled code is cached on disk under the cache directory (loading it takes about
// 0.2 s) and kept in memory by the Provider.
package wasm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest/codectx"
	"github.com/roche-sandbox/roche/provider/kit"
)

var (
	_ roche.Provider         = (*Provider)(nil)
	_ kit.Creator            = (*Provider)(nil)
	_ roche.FileCopier       = (*Provider)(nil)
	_ roche.TarCopier        = (*Provider)(nil)
	_ roche.GarbageCollector = (*Provider)(nil)
	_ roche.WorkspaceManager = (*Provider)(nil)
	_ roche.Resetter         = (*Provider)(nil)
	_ roche.Snapshotter      = (*Provider)(nil)
	_ io.Closer              = (*Provider)(nil)
)

// Provider is the WebAssembly backend. It is safe for concurrent use; Close releases
// the compiled code it holds.
type Provider struct {
	log        *slog.Logger
	cacheDir   string // python.wasm's default home and the compilation cache's parent
	stateDir   string // one directory per sandbox
	dataDir    string // workspaces and snapshots; made when first needed
	pythonPath string // set by WithPythonPath; empty means look it up

	runtime wazero.Runtime
	cache   wazero.CompilationCache // nil when the disk cache could not be opened

	// pythonMu serialises compiling python.wasm, so concurrent first execs compile it once.
	pythonMu sync.Mutex
	python   wazero.CompiledModule
	// pythonID names the python.wasm compiled, and exitCandidates the rewritten module's
	// exports that may be CPython's handle_system_exit (rewrite.go); none when python.wasm
	// could not be rewritten, and then there are no pre-initialised interpreters.
	pythonID       string
	exitCandidates []string
	// pythonData is python.wasm's data, kept out of the module compiled and written into
	// each of its instances by instantiate (datamerge.go), with that module; no segments
	// when the module keeps it. Atomic, so that instantiating another module never waits
	// for python.wasm's compilation, which holds pythonMu.
	pythonData atomic.Pointer[compiledPython]

	// mappings release the files mapped for the provider's life (python-rewritten.wasm's
	// data, the pre-initialised copies); Close calls them, under mapMu, and sets
	// unmapped. Instances are written from those files under mapMu's read lock
	// (fromMappings), so that none is written from a mapping Close released.
	mapMu    sync.RWMutex
	mappings []func()
	unmapped bool

	// preinits are the pre-initialised interpreters (preinit.go) by key, made or read
	// once per process; noPreinit turns them off (WithoutPreinit).
	preinitMu sync.Mutex
	preinits  map[string]*preinitImage
	noPreinit bool
	// preinitRuns counts the interpreters entered from a copy (for tests).
	preinitRuns atomic.Uint64

	// running holds the cancel functions of this process's execs by sandbox id, so that
	// Destroy can stop them instead of leaving them writing into a removed directory.
	runMu   sync.Mutex
	running map[string]map[*execHandle]struct{}
	// warm holds each sandbox's interpreter started ahead of its next exec (see
	// warm.go), when WithWarmStart asked for them; also under runMu.
	warm       map[string]*warmInstance
	warmServed uint64
	closed     bool
	// openFiles are the sandboxes' caps on open files (openFilesOf); also under runMu.
	openFiles map[string]*openFiles

	warmStart bool
	warmSlots chan struct{} // bounds the interpreters starting at once

	// instance names this provider in the sandboxes' records of code contexts (code.go).
	instance string
	// codeSets are the code contexts of this process, by sandbox (code.go).
	codeMu   sync.Mutex
	codeSets map[string]*codectx.Set
	// recordMu serialises this process's reads and writes of the sandboxes' codeFile.
	recordMu sync.Mutex
	// life ends at Close, stopping what runs in the background, which bg counts.
	life     context.Context
	stopLife context.CancelCauseFunc
	bg       sync.WaitGroup
}

// Option configures a Provider.
type Option func(*Provider)

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option {
	return func(p *Provider) {
		if l != nil {
			p.log = l
		}
	}
}

// WithPythonPath uses the python.wasm at path instead of looking for it (see
// PythonPath). A module named this way is trusted as given: its hash is not checked.
func WithPythonPath(path string) Option { return func(p *Provider) { p.pythonPath = path } }

// WithCacheDir sets the cache directory, by default ${XDG_CACHE_HOME:-$HOME/.cache}/roche:
// python.wasm is looked for there and compiled code is cached below its wazero
// subdirectory.
func WithCacheDir(dir string) Option { return func(p *Provider) { p.cacheDir = dir } }

// WithWarmStart makes the provider keep, for every sandbox, one CPython interpreter
// started ahead of the sandbox's next exec, and compile python.wasm in the background at
// once, so that an exec of python3 -c or python3 script.py does not wait about 0.1 s for
// the interpreter to initialise (see warm.go for what it serves and how). It is for
// long-lived processes such as roched: a process that exits after one command would only
// waste the work. Each idle sandbox then holds an initialised interpreter in memory.
func WithWarmStart() Option { return func(p *Provider) { p.warmStart = true } }

// WithoutPreinit starts every Python run's interpreter from scratch instead of from a
// pre-initialised copy (preinit.go).
func WithoutPreinit() Option { return func(p *Provider) { p.noPreinit = true } }

// WithStateDir sets the directory holding the sandboxes, by default
// $XDG_RUNTIME_DIR/roche/wasm, or roche-wasm-<uid> in the system temporary directory.
// Processes that share sandboxes must use the same one. Unless WithDataDir says
// otherwise, workspaces and snapshots then live in its data subdirectory.
func WithStateDir(dir string) Option { return func(p *Provider) { p.stateDir = dir } }

// WithDataDir sets the directory holding persistent workspaces and snapshots, which
// must outlive the sandboxes (and a reboot, which empties the runtime directory). By
// default it is ${XDG_DATA_HOME:-$HOME/.local/share}/roche/wasm (/var/lib/roche/wasm
// for root), or the data subdirectory of the state directory named by WithStateDir:
// whether a workspace is in use is read from the sandboxes of one state directory, so
// a data directory belongs with one state directory.
func WithDataDir(dir string) Option { return func(p *Provider) { p.dataDir = dir } }

// New returns a wasm Provider. It does not load python.wasm: that happens on the first
// Create or Exec (or Prepare), so listing and destroying sandboxes work without it.
func New(opts ...Option) (*Provider, error) {
	p := &Provider{
		log:     slog.New(slog.DiscardHandler),
		running: map[string]map[*execHandle]struct{}{},
		warm:    map[string]*warmInstance{},
		// One CPU is left to the execs themselves.
		warmSlots: make(chan struct{}, max(runtime.GOMAXPROCS(0)-1, 1)),
		preinits:  map[string]*preinitImage{},
	}
	p.life, p.stopLife = context.WithCancelCause(context.Background())
	var inst [8]byte
	_, _ = rand.Read(inst[:])
	p.instance = hex.EncodeToString(inst[:])
	p.cacheDir = defaultCacheDir()
	for _, o := range opts {
		o(p)
	}
	switch {
	case p.stateDir == "":
		p.stateDir = defaultStateDir()
		if p.dataDir == "" {
			p.dataDir = defaultDataDir()
		}
	case p.dataDir == "":
		p.dataDir = filepath.Join(p.stateDir, dataSubdir)
	}
	if p.stateDir == "" {
		return nil, fmt.Errorf("%w: wasm provider: no state directory: set XDG_RUNTIME_DIR or use WithStateDir", roche.ErrUnavailable)
	}
	dir, err := prepareStateDir(p.stateDir)
	if err != nil {
		return nil, err
	}
	p.stateDir = dir
	if p.dataDir == "" {
		return nil, fmt.Errorf("%w: wasm provider: no data directory for workspaces and snapshots: set HOME or use WithDataDir", roche.ErrUnavailable)
	}
	if p.dataDir, err = filepath.Abs(p.dataDir); err != nil {
		return nil, fmt.Errorf("%w: wasm data directory: %v", roche.ErrUnavailable, err)
	}

	ctx := context.Background()
	rcfg := wazero.NewRuntimeConfig().
		// A timeout must stop guest code that never calls the host, like `while True: pass`.
		WithCloseOnContextDone(true).
		// With DWARF, wazero looks up source lines for every frame of a module it stops
		// or that traps: seconds for python.wasm, which would overrun every timeout.
		// Function names (from the name section) still appear in trap traces.
		WithDebugInfoEnabled(false)
	if p.cacheDir != "" {
		// wazero keys cached code by module hash, CPU and its own version, but not by the
		// runtime settings that change the code: code compiled without close-on-done has
		// no termination checks, and would ignore every timeout if loaded here. The
		// directory name stands for the settings above; change it when they change.
		cacheDir := filepath.Join(p.cacheDir, "wazero", "close-on-done-no-dwarf")
		cache, err := wazero.NewCompilationCacheWithDir(cacheDir)
		if err != nil {
			// Only speed is lost: every process compiles python.wasm from scratch.
			p.log.Warn("wasm: compilation cache unavailable; python.wasm will be compiled in every process",
				"dir", cacheDir, "err", err)
		} else {
			p.cache = cache
			rcfg = rcfg.WithCompilationCache(cache)
		}
	}
	p.runtime = wazero.NewRuntimeWithConfig(ctx, rcfg)
	// WASI preview1 is the only host module: guests get files, clocks and randomness,
	// nothing else. Its socket functions have no sockets to act on.
	if err := instantiateWASI(ctx, p.runtime); err != nil {
		_ = p.Close()
		return nil, fmt.Errorf("%w: wasm provider: instantiating WASI: %v", roche.ErrUnavailable, err)
	}
	if p.warmStart && p.checkPython() == nil {
		p.bg.Add(1)
		go func() {
			defer p.bg.Done()
			start := time.Now()
			if err := p.Prepare(p.life); err != nil {
				if !errors.Is(err, context.Canceled) {
					p.log.Warn("wasm: preparing python.wasm in the background failed; execs will try again", "err", err)
				}
				return
			}
			p.log.Info("wasm: python.wasm compiled and kept in memory", "took", time.Since(start).Round(time.Millisecond))
		}()
	}
	return p, nil
}

// Available reports, cheaply, whether python.wasm is where the provider looks for it:
// when it is not, the error says how to fetch it, and every Create fails with it
// (wrapping roche.ErrUnavailable).
func (p *Provider) Available() error { return p.checkPython() }

// Name implements roche.Provider.
func (p *Provider) Name() string { return "wasm" }

// Capabilities implements roche.Provider.
//
// Writable means writable=true is honoured by making the sandbox's own / writable (it
// starts empty; the standard library under /usr stays read-only); /tmp and /workspace
// are writable either way. Mounts are host directories, read-only unless rw. Processes
// is false: a module is one thread with no fork, signals, users or /proc, which is why
// pids_limit and user do not apply. cpus does apply: a module never uses more than one
// CPU, so cpus >= 1 is honoured and cpus < 1 is refused.
func (p *Provider) Capabilities() roche.Capabilities {
	return roche.Capabilities{
		Network:   false,
		Writable:  true,
		Mounts:    true,
		Files:     true,
		Pause:     false,
		Stdin:     true,
		Processes: false,
		// The kernel runs in python.wasm, which has no matplotlib or pandas.
		Code:          []string{roche.LanguagePython},
		RichResults:   false,
		NotApplicable: []string{"pids_limit", "user"},
	}
}

// Prepare loads and compiles python.wasm now, so that the first Exec does not pay for it
// (seconds when compiling from scratch, about one from the disk cache).
func (p *Provider) Prepare(ctx context.Context) error {
	_, err := p.pythonModule(ctx)
	return err
}

// Close releases the compiled code, the runtime and the files mapped (the rewritten
// python.wasm's data, the pre-initialised copies). Execs still running are stopped,
// and so is everything the provider runs in the background (the warm interpreters).
func (p *Provider) Close() error {
	ctx := context.Background()
	p.runMu.Lock()
	p.closed = true
	p.runMu.Unlock()
	p.stopLife(errClosed)
	p.bg.Wait()
	var errs []error
	if p.runtime != nil {
		errs = append(errs, p.runtime.Close(ctx))
	}
	if p.cache != nil {
		errs = append(errs, p.cache.Close(ctx))
	}
	p.mapMu.Lock()
	p.unmapped = true
	for _, unmap := range p.mappings {
		unmap()
	}
	p.mappings = nil
	p.mapMu.Unlock()
	return errors.Join(errs...)
}

// keepMapping hands unmap, which releases a file mapped for the provider's life, to
// Close. It reports false, having called it, when Close has run.
func (p *Provider) keepMapping(unmap func()) bool {
	p.mapMu.Lock()
	defer p.mapMu.Unlock()
	if p.unmapped {
		unmap()
		return false
	}
	p.mappings = append(p.mappings, unmap)
	return true
}

// fromMappings runs write, which copies from the files mapped for the provider's life
// into an instance, unless Close has released them.
func (p *Provider) fromMappings(write func() error) error {
	p.mapMu.RLock()
	defer p.mapMu.RUnlock()
	if p.unmapped {
		return errClosed
	}
	return write()
}

// defaultCacheDir is ${XDG_CACHE_HOME:-$HOME/.cache}/roche, spelled out rather than
// taken from os.UserCacheDir so that it matches what InstallPython fetches into on every OS.
func defaultCacheDir() string {
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "roche")
	}
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		return ""
	}
	return filepath.Join(home, ".cache", "roche")
}

// defaultStateDir prefers the per-user runtime directory, which only its user can enter
// and which is emptied at logout; otherwise a per-uid directory in the temporary
// directory, checked for ownership by prepareStateDir.
func defaultStateDir() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "roche", "wasm")
	}
	return filepath.Join(os.TempDir(), "roche-wasm-"+strconv.Itoa(os.Getuid()))
}

// defaultDataDir keeps what must outlive sandboxes and reboots, as the Docker provider's
// data directory does.
func defaultDataDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/roche/wasm"
	}
	if d := os.Getenv("XDG_DATA_HOME"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "roche", "wasm")
	}
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		return ""
	}
	return filepath.Join(home, ".local", "share", "roche", "wasm")
}

// prepareStateDir creates dir (mode 0700) and returns its absolute, symlink-free path.
func prepareStateDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("%w: wasm state directory %s: %v", roche.ErrUnavailable, dir, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return "", fmt.Errorf("%w: creating wasm state directory %s: %v", roche.ErrUnavailable, abs, err)
	}
	// In a shared temporary directory another user could have made it first, or made it
	// a symlink; sandboxes must not live anywhere someone else controls.
	if err := checkPrivateDir(abs); err != nil {
		return "", fmt.Errorf("%w: wasm state directory %s: %v; remove it or choose another with WithStateDir", roche.ErrUnavailable, abs, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", fmt.Errorf("%w: wasm state directory %s: %v", roche.ErrUnavailable, abs, err)
	}
	return real, nil
}
