package wasm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/sys"

	"github.com/roche-sandbox/roche/internal/buildinfo"
	"github.com/roche-sandbox/roche/provider/internal/statedir"
)

// A pre-initialised interpreter. Starting CPython costs every run ~140-170 ms of CPU,
// the same work each time. Instead, once per python.wasm, Roche version, layout of the
// sandbox's directories and way of starting (preinitStart: none for execs; a code
// context's kernel runs with -u, kernel.StdioArgv, and its copy has the kernel's imports
// done, code.go's kernelPreinit), the provider starts `python3 OPTIONS -` with
// preinitEnv set, so that the start-up hook (boot/sitecustomize.py) loads boot/warm.py,
// which writes where its entry is, and copies the instance's linear memory and C stack
// pointer when CPython first reads its program from stdin (the provider's reader, so it
// sees the read): the interpreter has started and imported what every run imports, runs
// no Python frame, and holds its GIL in the parser, in C. That instance is then ended; its wasm call
// stack is lost, which does not matter, as nothing returns to it.
//
// A run from the copy instantiates python.wasm (rewritten with the exports of
// rewrite.go) without calling _start, writes the copy's memory over the new instance's,
// sets the stack pointer below the copy's (the abandoned C frames above it are never
// overwritten), and calls warm.py's _entry through the function type's tp_call, whose
// table index it reads from the copy. _entry serves one request as a warm interpreter
// does (argv, environment, working directory, the program, its exceptions), then raises
// SystemExit, and the host calls CPython's handle_system_exit, which finalises the
// interpreter (atexit, flushing) and exits as a fresh one would. A code context's kernel
// (code.go) is such a run, whose program reads its cells from stdin after the request.
//
// Each run is a new instance, so nothing of one run reaches the next. What runs from one
// copy share: the string-hash secret CPython drew while it started (so the order of a
// set of strings is the same in every run from the copy; PYTHONHASHSEED is read at
// start, so an exec setting it runs fresh), and whatever start-up computed. The random
// module, when imported, is seeded again from the host's randomness. Copies are made per
// user, in the private state directory (0700, files 0600), and read only when private
// to this user (statedir.ReadPrivate): one planted or altered by another local user is
// not used. warm.py freezes start-up's objects (gc.freeze) before the copy, so that
// finalisation at each run's exit neither walks nor tears them down (~12 ms of ~18).
// What a program can tell: its frame has two of Roche's below it (warm.py's _entry and
// _serve), so recursion runs out two calls sooner; the frozen objects (gc's counts and
// get_objects); and at exit, objects it hung on start-up's modules are finalised in
// another order, and one hung only on a start-up class or function not at all
// (TestPreinitCollection).

const (
	// preinitMagic starts a copy's file; the version changes with its layout.
	preinitMagic = "roche-python-preinit-1\n"
	// maxPreinitFile bounds the file read.
	maxPreinitFile = 512 << 20
	// preinitChunk is the granularity at which the copy is compared with a fresh
	// instance's memory and kept.
	preinitChunk = 4096
	// tpCallOffset is PyTypeObject's tp_call in wasm32 CPython 3.12: after the
	// variable-size header (3 words) and 13 words of slots.
	tpCallOffset = 64
	// preinitStackGap is left between the copy's stack pointer and the new frames.
	preinitStackGap = 256
)

// preinitImage is a copy of an initialised interpreter.
type preinitImage struct {
	Key   string `json:"key"`
	Pages uint32 `json:"pages"`
	SP    uint32 `json:"sp"`
	// Entry is id(warm.py's _entry); TPCall the table index of its type's tp_call;
	// EmptyTuple id(()); Exit the export found to be handle_system_exit. Unusable: no
	// copy could be made for this key (Reason says why), so runs start fresh.
	Entry      uint32 `json:"entry"`
	TPCall     uint32 `json:"tp_call"`
	EmptyTuple uint32 `json:"empty_tuple"`
	Exit       string `json:"exit"`
	Unusable   bool   `json:"unusable,omitempty"`
	Reason     string `json:"reason,omitempty"`

	chunks []preinitChunkData
}

type preinitChunkData struct {
	off  uint32
	data []byte
}

// preinitKey identifies what a copy depends on: python.wasm (its digest when pinned,
// else its path and version stamp), Roche's version, rewriteVersion (a development
// build's version does not change with the rewrite) and warm.py, the guest paths of the
// sandbox's directories in order (WASI's preopens, which libc remembers in memory), and
// how the interpreter starts (preinitStart).
func (p *Provider) preinitKey(mounts []mountPoint, how preinitStart) string {
	var guests []string
	for _, m := range mounts {
		guests = append(guests, m.guest)
	}
	site, _ := bootFiles.ReadFile("boot/sitecustomize.py")
	boot := sha256.Sum256(append([]byte(warmSource), site...))
	return strings.Join([]string{buildinfo.Version(), rewriteVersion, hex.EncodeToString(boot[:]), p.pythonID, strings.Join(guests, "\x00"),
		strings.Join(how.opts, "\x00"), strings.Join(how.preload, "\x00")}, "\x01")
}

func (p *Provider) preinitFile(key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(p.stateDir, "python-preinit-"+hex.EncodeToString(sum[:8])+".bin")
}

// preinitStart is how the interpreter of a copy starts: with python3's options before
// its program (opts, which CPython reads while it starts), and importing the modules
// preload before the copy is taken. Execs have neither; a code context's kernel runs
// with -u (kernel.StdioArgv) and imports its modules first thing, so its copy is another.
type preinitStart struct {
	opts, preload []string
}

// preinitFor returns the copy for runs with these mounts of `python3 OPTS -c ...`,
// making it if there is none, or nil when runs must start fresh (no rewritten module, or
// the copy could not be made).
func (p *Provider) preinitFor(ctx context.Context, mounts []mountPoint, how preinitStart) *preinitImage {
	if p.noPreinit || len(p.exitCandidates) == 0 || p.pythonID == "" {
		return nil
	}
	key := p.preinitKey(mounts, how)
	p.preinitMu.Lock()
	defer p.preinitMu.Unlock()
	if img, ok := p.preinits[key]; ok {
		if img.Unusable {
			return nil
		}
		return img
	}
	file := p.preinitFile(key)
	img, unmap, err := readPreinit(file, key)
	if err == nil && !p.keepMapping(unmap) {
		return nil // closed
	}
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			p.log.Warn("wasm: ignoring the pre-initialised interpreter's file; making it again", "file", file, "err", err)
		}
		start := time.Now()
		img, err = p.makePreinit(ctx, mounts, how, key)
		if err != nil {
			if ctx.Err() != nil {
				return nil // not the copy's fault: try again next time
			}
			p.log.Warn("wasm: no pre-initialised interpreter; Python runs start fresh", "err", err)
			img = &preinitImage{Key: key, Unusable: true, Reason: err.Error()}
		} else {
			p.log.Debug("wasm: pre-initialised interpreter made", "took", time.Since(start), "chunks", len(img.chunks))
		}
		if werr := statedir.WritePrivate(file, img.encode()); werr != nil {
			p.log.Debug("wasm: keeping the pre-initialised interpreter", "file", file, "err", werr)
		}
	}
	p.preinits[key] = img
	if img.Unusable {
		return nil
	}
	return img
}

// encode is the file: preinitMagic, the header's length (4 bytes, little endian) and
// JSON, then each chunk as offset, length and bytes.
func (img *preinitImage) encode() []byte {
	head, _ := json.Marshal(img)
	var b bytes.Buffer
	b.WriteString(preinitMagic)
	_ = binary.Write(&b, binary.LittleEndian, uint32(len(head)))
	b.Write(head)
	for _, c := range img.chunks {
		_ = binary.Write(&b, binary.LittleEndian, [2]uint32{c.off, uint32(len(c.data))})
		b.Write(c.data)
	}
	return b.Bytes()
}

// readPreinit reads a copy for key from file, private to this user; unmap releases
// its chunks.
func readPreinit(file, key string) (img *preinitImage, unmap func(), err error) {
	// Mapped, not read: its chunks are copied into each instance's memory straight from
	// the page cache. The mapping is the image's for as long as the provider keeps it
	// (one per key, until Close).
	b, mapping, err := statedir.MapPrivate(file, maxPreinitFile)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			mapping.Unmap()
		}
	}()
	bad := func(why string) error { return fmt.Errorf("%s: %s", file, why) }
	if !bytes.HasPrefix(b, []byte(preinitMagic)) || len(b) < len(preinitMagic)+4 {
		return nil, nil, bad("not a pre-initialised interpreter")
	}
	b = b[len(preinitMagic):]
	n := binary.LittleEndian.Uint32(b)
	b = b[4:]
	if uint64(n) > uint64(len(b)) {
		return nil, nil, bad("truncated")
	}
	img = &preinitImage{}
	if err := json.Unmarshal(b[:n], img); err != nil {
		return nil, nil, bad(err.Error())
	}
	if img.Key != key {
		return nil, nil, bad("made for another python.wasm, Roche or layout")
	}
	b = b[n:]
	limit := uint64(img.Pages) * 65536
	for len(b) > 0 {
		if len(b) < 8 {
			return nil, nil, bad("truncated")
		}
		off, size := binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:])
		b = b[8:]
		if uint64(size) > uint64(len(b)) || uint64(off)+uint64(size) > limit {
			return nil, nil, bad("a chunk is out of bounds")
		}
		img.chunks = append(img.chunks, preinitChunkData{off, b[:size:size]})
		b = b[size:]
	}
	return img, mapping.Unmap, nil
}

// makePreinit starts CPython as how says in warm.py's snapshot mode with directories at
// the guest paths of mounts (empty, private, read-only) and copies it.
func (p *Provider) makePreinit(ctx context.Context, mounts []mountPoint, how preinitStart, key string) (*preinitImage, error) {
	mod, err := p.pythonModule(ctx)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(p.stateDir, preinitTempPrefix)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var empty []mountPoint
	for i, m := range mounts {
		host := filepath.Join(dir, fmt.Sprint(i))
		if err := os.Mkdir(host, 0o700); err != nil {
			return nil, err
		}
		empty = append(empty, mountPoint{guest: m.guest, host: host, readOnly: true})
	}

	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var (
		out     preinitOutput
		inst    api.Module
		initial []byte
	)
	// CPython reads its program from stdin once it has started: the copy is taken then,
	// and the read answered with the end of the file, so that it runs an empty program.
	in := &preinitStdin{}
	in.copy = func() {
		if !out.armed() || inst == nil {
			return
		}
		mem := inst.Memory()
		if b, ok := mem.Read(0, mem.Size()); ok {
			copied := bytes.Clone(b)
			in.copied, in.sp = copied, inst.ExportedGlobal(preinitSP).Get()
		}
	}
	fsc, _, _ := sandboxFS(empty, true)
	argv := append(append([]string{warmArgv0}, how.opts...), "-")
	mcfg := moduleConfig(ctx, argv, map[string]string{"PYTHONPATH": guestBoot, preinitEnv: strings.Join(how.preload, " ")},
		fsc, &out, &out).WithStdin(in)
	inst, err = p.instantiate(ctx, mod, mcfg)
	if err != nil {
		return nil, err
	}
	defer inst.Close(context.Background())
	if b, ok := inst.Memory().Read(0, inst.Memory().Size()); ok {
		initial = bytes.Clone(b)
	}
	_, callErr := inst.ExportedFunction("_start").Call(ctx)
	var exit *sys.ExitError
	if callErr != nil && (!errors.As(callErr, &exit) || exit.ExitCode() != 0) || in.copied == nil {
		return nil, fmt.Errorf("python.wasm did not reach the point to copy (%v): %s", callErr, out.text())
	}
	copied, sp := in.copied, in.sp
	entry, typ, tuple, ok := out.marker()
	if !ok || uint64(typ)+tpCallOffset+4 > uint64(len(copied)) {
		return nil, fmt.Errorf("warm.py did not say where its entry is: %q", out.text())
	}
	img := &preinitImage{
		Key: key, Pages: uint32(len(copied) / 65536), SP: uint32(sp),
		Entry: entry, EmptyTuple: tuple,
		TPCall: binary.LittleEndian.Uint32(copied[typ+tpCallOffset:]),
	}
	for off := 0; off < len(copied); off += preinitChunk {
		c := copied[off:min(off+preinitChunk, len(copied))]
		var was []byte
		if off < len(initial) {
			was = initial[off:min(off+preinitChunk, len(initial))]
		}
		if bytes.Equal(c, was) || was == nil && isZero(c) {
			continue
		}
		if n := len(img.chunks); n > 0 && img.chunks[n-1].off+uint32(len(img.chunks[n-1].data)) == uint32(off) {
			img.chunks[n-1].data = append(img.chunks[n-1].data, c...)
		} else {
			img.chunks = append(img.chunks, preinitChunkData{uint32(off), bytes.Clone(c)})
		}
	}
	// Which exit candidate is CPython's handle_system_exit: the one that, after a
	// program registered an atexit function and raised SystemExit(7), runs it and exits 7.
	probe := `import atexit, sys
atexit.register(lambda: sys.stdout.write("roche-atexit\n"))
sys.stdout.write("roche-ok\n")
raise SystemExit(7)`
	req := warmRequest(program{argv: append(append([]string{warmArgv0}, how.opts...), "-c", probe), workdir: "/"})
	for _, name := range p.exitCandidates {
		img.Exit = name
		var stdout, stderr bytes.Buffer
		code, err := p.tryPreinit(ctx, img, empty, req, &stdout, &stderr)
		if err == nil && code == 7 && stdout.String() == "roche-ok\nroche-atexit\n" {
			return img, nil
		}
		p.log.Debug("wasm: exit candidate refused", "name", name, "code", code, "err", err,
			"stdout", stdout.String(), "stderr", stderr.String())
	}
	return nil, errors.New("no function of python.wasm ends the interpreter as CPython's handle_system_exit does")
}

// tryPreinit runs req on a new instance from img, for makePreinit's check.
func (p *Provider) tryPreinit(ctx context.Context, img *preinitImage, mounts []mountPoint, req []byte,
	stdout, stderr io.Writer) (uint32, error) {
	compiled, err := p.pythonModule(ctx)
	if err != nil {
		return 0, err
	}
	fsc, _, _ := sandboxFS(mounts, true)
	mcfg := moduleConfig(ctx, []string{warmArgv0}, nil, fsc, stdout, stderr).WithStdin(bytes.NewReader(req))
	inst, err := p.instantiate(ctx, compiled, mcfg)
	if err != nil {
		return 0, err
	}
	defer inst.Close(context.Background())
	callErr := p.loadPreinit(inst, img)
	if callErr == nil {
		callErr = runPreinit(ctx, inst, img)
	}
	var exit *sys.ExitError
	if errors.As(callErr, &exit) {
		return exit.ExitCode(), nil
	}
	return 0, fmt.Errorf("ended without exiting: %v", callErr)
}

var errPreinitMemory = errors.New("the pre-initialised interpreter needs more memory than the sandbox's limit")

// enterPreinit makes inst (python.wasm rewritten, instantiated without its start
// functions) the copy img, and runs warm.py's _entry on it: the request comes from its
// stdin. It returns what a call of _start would: how the guest exited. It is counted
// (preinitRuns); makePreinit's check is not.
func (p *Provider) enterPreinit(ctx context.Context, inst api.Module, img *preinitImage) error {
	p.preinitRuns.Add(1)
	if err := p.loadPreinit(inst, img); err != nil {
		return err
	}
	return runPreinit(ctx, inst, img)
}

// loadPreinit is loadCopy from img's mapping, unless Close has released it.
func (p *Provider) loadPreinit(inst api.Module, img *preinitImage) error {
	return p.fromMappings(func() error { return loadCopy(inst, img) })
}

// loadCopy makes inst the copy img: its memory and stack pointer. errPreinitMemory:
// the sandbox's memory limit refused the copy's pages.
func loadCopy(inst api.Module, img *preinitImage) error {
	mem := inst.Memory()
	if have := mem.Size() / 65536; have < img.Pages {
		if _, ok := mem.Grow(img.Pages - have); !ok {
			return errPreinitMemory
		}
	}
	for _, c := range img.chunks {
		if !mem.Write(c.off, c.data) {
			return errors.New("the pre-initialised interpreter does not fit its memory")
		}
	}
	sp, ok := inst.ExportedGlobal(preinitSP).(api.MutableGlobal)
	if !ok || img.SP < preinitStackGap {
		return errors.New("python.wasm's stack pointer is not exported")
	}
	sp.Set(uint64((img.SP - preinitStackGap) &^ 15))
	return nil
}

// runPreinit runs warm.py's _entry on inst, which loadPreinit made the copy img, and
// returns how the guest exited.
func runPreinit(ctx context.Context, inst api.Module, img *preinitImage) error {
	call, exit := inst.ExportedFunction(preinitCall), inst.ExportedFunction(img.Exit)
	if call == nil || exit == nil {
		return errors.New("python.wasm lacks the pre-initialised interpreter's entries")
	}
	res, err := call.Call(ctx, uint64(img.TPCall), uint64(img.Entry), uint64(img.EmptyTuple), 0)
	if err != nil {
		return err
	}
	if res[0] != 0 {
		return errors.New("warm.py's _entry returned instead of raising SystemExit")
	}
	if _, err := exit.Call(ctx); err != nil {
		return err
	}
	return errors.New("the interpreter did not exit after its program")
}

// preinitTempPrefix names the directories makePreinit mounts, in the state directory;
// sweepLeftovers removes old ones.
const preinitTempPrefix = "preinit-"

// preinitEnv, set for the start that is copied, makes boot/sitecustomize.py load warm.py;
// its value is the modules warm.py imports before the copy (preinitStart.preload),
// separated by spaces.
const preinitEnv = "ROCHE_WASM_PREINIT"

// preinitStdin is the stdin of the start that is copied: its first read takes the copy,
// and every read ends the file.
type preinitStdin struct {
	copy   func()
	done   bool
	copied []byte
	sp     uint64
}

func (s *preinitStdin) Read([]byte) (int, error) {
	if !s.done {
		s.done = true
		s.copy()
	}
	return 0, io.EOF
}

// preinitOutput collects what the snapshot run writes, and spots warm.py's marker.
type preinitOutput struct {
	mu  sync.Mutex
	buf []byte
}

func (o *preinitOutput) Write(b []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.buf) < earlyOutputLimit {
		o.buf = append(o.buf, b[:min(len(b), earlyOutputLimit-len(o.buf))]...)
	}
	return len(b), nil
}

func (o *preinitOutput) text() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return strings.TrimSpace(string(o.buf))
}

func (o *preinitOutput) armed() bool {
	_, _, _, ok := o.marker()
	return ok
}

// marker parses "\0roche-preinit ENTRY TYPE TUPLE\n".
func (o *preinitOutput) marker() (entry, typ, tuple uint32, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	i := bytes.Index(o.buf, []byte("\x00roche-preinit "))
	if i < 0 {
		return 0, 0, 0, false
	}
	line, _, found := bytes.Cut(o.buf[i+1:], []byte("\n"))
	if !found {
		return 0, 0, 0, false
	}
	n, err := fmt.Sscanf(string(line), "roche-preinit %d %d %d", &entry, &typ, &tuple)
	return entry, typ, tuple, err == nil && n == 3
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// withPreinitStdin is the stdin of a run from a copy: the request, then the exec's.
func withPreinitStdin(req []byte, stdin io.Reader) io.Reader {
	if stdin == nil {
		return bytes.NewReader(req)
	}
	return io.MultiReader(bytes.NewReader(req), stdin)
}
