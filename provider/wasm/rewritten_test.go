package wasm

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestSplitData: a module without its data section, and the segments written into a new
// instance of it (writeData), give the memory an instance of the module starts with;
// what splitData cannot keep apart as that (a data count section, a passive segment, a
// data section not last, a start section, which would run before the data is written)
// it leaves alone.
func TestSplitData(t *testing.T) {
	ctx := context.Background()
	r := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer r.Close(ctx)
	wasi_snapshot_preview1.MustInstantiate(ctx, r)
	bin := withData(16, "abc", 5000, "defg", 17, "x")
	mod, segs, ok := splitData(bin)
	if !ok || len(segs) != 3 || len(mod) >= len(bin) {
		t.Fatalf("splitData: ok %v, %d segments, %d of %d bytes", ok, len(segs), len(mod), len(bin))
	}
	if secs, find, err := moduleSections(mod); err != nil || find(11) != nil || len(secs) == 0 {
		t.Fatalf("the module without its data: %v", err)
	}
	compiled, err := r.CompileModule(ctx, mod)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := r.InstantiateModule(ctx, compiled, wazero.NewModuleConfig().WithName("").WithStartFunctions())
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(ctx)
	if err := writeData(inst, segs); err != nil {
		t.Fatal(err)
	}
	got, _ := inst.Memory().Read(0, inst.Memory().Size())
	if !bytes.Equal(got, initialMemory(t, r, bin)) {
		t.Fatal("the module's memory with its data written differs from the module's")
	}
	if err := writeData(inst, []memorySegment{{off: inst.Memory().Size() - 1, data: []byte("ab")}}); err == nil {
		t.Error("a segment past the memory's end was written")
	}

	passive := withData(16, "abc")
	passive[len(passive)-len("abc")-5] = 1 // the segment's flags: passive (no offset follows, but it is refused first)
	dataCount := append(tinyModule(), 12, 1, 1)
	dataCount = append(dataCount, withData(16, "abc")[len(tinyModule()):]...)
	withStart := withData(16, "abc")
	secs, _, err := moduleSections(withStart)
	if err != nil {
		t.Fatal(err)
	}
	for _, sec := range secs {
		if sec.id == 7 { // the start section follows the exports: start is function 1, of type () -> ()
			withStart = slices.Concat(withStart[:sec.end], []byte{8, 1, 1}, withStart[sec.end:])
		}
	}
	if _, err := r.CompileModule(ctx, withStart); err != nil {
		t.Fatalf("the module with a start section: %v", err)
	}
	for name, b := range map[string][]byte{"no data section": tinyModule(), "passive": passive, "data count": dataCount, "start section": withStart} {
		if _, _, ok := splitData(b); ok {
			t.Errorf("%s: split", name)
		}
	}
}

// TestRewrittenKept: the first process to compile python.wasm keeps the module as
// compiled (rewrittenFile), and the next maps and compiles that instead of reading and
// rewriting python.wasm: the same module, the same data, and Python runs, from a copy
// and fresh. One kept for another python.wasm, Roche or rewrite (rewriteVersion), or cut
// short, is not used.
func TestRewrittenKept(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	ctx := context.Background()
	dir := t.TempDir()
	open := func(opts ...Option) (*Provider, *bytes.Buffer) {
		t.Helper()
		var log bytes.Buffer
		h := slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug})
		p, err := New(append([]Option{WithStateDir(dir), WithLogger(slog.New(h))}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		if err := p.Prepare(ctx); err != nil {
			t.Fatal(err)
		}
		return p, &log
	}
	kept := func(log *bytes.Buffer) bool { return strings.Contains(log.String(), "kept="+rewrittenFile) }
	first, log := open(WithoutPreinit())
	if kept(log) {
		t.Fatal("the first provider of a new state directory compiled a kept module")
	}
	firstData := first.pythonData.Load().segs
	if len(firstData) == 0 || len(first.exitCandidates) == 0 {
		t.Fatalf("python.wasm compiled with %d data segments apart and %d exit candidates", len(firstData), len(first.exitCandidates))
	}
	file := filepath.Join(dir, rewrittenFile)
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for name, opts := range map[string][]Option{"fresh": {WithoutPreinit()}, "from a copy": nil} {
		p, log := open(opts...)
		if !kept(log) {
			t.Fatalf("%s: the kept module was not used: %s", name, log)
		}
		if p.pythonID != first.pythonID || !slices.Equal(p.exitCandidates, first.exitCandidates) || len(p.pythonData.Load().segs) != len(firstData) {
			t.Fatalf("%s: the kept module's id, exits or data differ", name)
		}
		for i, s := range p.pythonData.Load().segs {
			if s.off != firstData[i].off || !bytes.Equal(s.data, firstData[i].data) {
				t.Fatalf("%s: data segment %d differs", name, i)
			}
		}
		info, err := p.Create(ctx, roche.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		res, err := p.Exec(ctx, info.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "import json; print(json.dumps([6 * 7]))"}})
		p.Destroy(ctx, info.ID)
		if err != nil || res.ExitCode != 0 || res.Stdout != "[42]\n" {
			t.Fatalf("%s: %+v %v", name, res, err)
		}
		if runs := p.preinitRuns.Load(); (runs > 0) != (opts == nil) {
			t.Errorf("%s: %d runs from a copy", name, runs)
		}
	}

	// Another python.wasm's id, of the same length: one character changed.
	id := first.pythonID
	otherID := id[:len(id)-1] + map[bool]string{true: "1", false: "0"}[id[len(id)-1] == '0']
	other := bytes.Replace(b, []byte(id), []byte(otherID), 1)
	if bytes.Equal(other, b) {
		t.Fatalf("the kept module's id %q is not in its file", id)
	}
	// Another rewrite of the same python.wasm by the same Roche (a development build).
	key, _ := json.Marshal(rewrittenKey(id))
	otherKey, _ := json.Marshal(strings.Replace(rewrittenKey(id), "\x01"+rewriteVersion+"\x01", "\x01"+rewriteVersion+"x\x01", 1))
	otherRewrite := bytes.Replace(b, key, otherKey, 1)
	if bytes.Equal(otherRewrite, b) {
		t.Fatalf("the kept module's key %s is not in its file", key)
	}
	for name, planted := range map[string][]byte{"another python.wasm": other, "another rewrite": otherRewrite, "cut short": b[:len(b)-1]} {
		if err := os.WriteFile(file, planted, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, log := open(WithoutPreinit()); kept(log) {
			t.Errorf("%s: used", name)
		}
		if again, err := os.ReadFile(file); err != nil || !bytes.Equal(again, b) {
			t.Errorf("%s: not kept again as it was (%v)", name, err)
		}
	}
}

// TestRewrittenDataOwned: without a kept file to map them from, python.wasm's data
// segments, slices of the buffer it was read into, are copied into one buffer of their
// own, so that the read buffer (14 MB) is not held for the process's life; one segment
// cannot be grown into the next.
func TestRewrittenDataOwned(t *testing.T) {
	p := &Provider{}
	read := []byte("..abc....defg.x")
	data := []memorySegment{{off: 16, data: read[2:5]}, {off: 5000, data: read[9:13]}, {off: 17, data: read[14:15]}}
	own := p.ownData("", false, data)
	copy(read, bytes.Repeat([]byte{'-'}, len(read)))
	var all []byte
	for i, s := range own {
		if s.off != data[i].off {
			t.Fatalf("segment %d at %d, want %d", i, s.off, data[i].off)
		}
		all = append(all, s.data...)
	}
	if string(all) != "abcdefgx" {
		t.Fatalf("the segments owned hold %q, want %q: still slices of what was read", all, "abcdefgx")
	}
	for i, s := range own {
		if cap(s.data) != len(s.data) {
			t.Errorf("segment %d has room for %d bytes more, another's", i, cap(s.data)-len(s.data))
		}
	}
}
