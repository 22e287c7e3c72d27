package wasm

import (
	"bytes"
	"context"
	"os"
	"slices"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/roche-sandbox/roche/internal/testenv"
)

// withData is tinyModule with a data section of segs, each (offset, bytes).
func withData(segs ...any) []byte {
	payload := appendULEB(nil, uint32(len(segs)/2))
	for i := 0; i < len(segs); i += 2 {
		payload = append(payload, 0, 0x41)
		payload = appendSLEB32(payload, int32(segs[i].(int)))
		payload = append(payload, 0x0b)
		payload = appendULEB(payload, uint32(len(segs[i+1].(string))))
		payload = append(payload, segs[i+1].(string)...)
	}
	m := tinyModule()
	m = append(appendULEB(append(m, 11), uint32(len(payload))), payload...)
	return m
}

// initialMemory instantiates bin without its start functions and returns its memory.
func initialMemory(t *testing.T, r wazero.Runtime, bin []byte) []byte {
	t.Helper()
	ctx := context.Background()
	compiled, err := r.CompileModule(ctx, bin)
	if err != nil {
		t.Fatalf("compiling: %v", err)
	}
	defer compiled.Close(ctx)
	mod, err := r.InstantiateModule(ctx, compiled, wazero.NewModuleConfig().WithName("").WithStartFunctions())
	if err != nil {
		t.Fatalf("instantiating: %v", err)
	}
	defer mod.Close(ctx)
	b, _ := mod.Memory().Read(0, mod.Memory().Size())
	return bytes.Clone(b)
}

func dataSegments(t *testing.T, bin []byte) uint32 {
	t.Helper()
	secs, _, err := moduleSections(bin)
	if err != nil || secs[len(secs)-1].id != 11 {
		t.Fatalf("no data section last: %v", err)
	}
	r := &wreader{b: bin, off: secs[len(secs)-1].start}
	return r.u32()
}

// TestMergeDataSegments: segments close together become one, the gap zero, and an
// instance of the merged module starts with the same memory as one of the module; in
// place when there is room, writing what a new buffer gets. Segments out of order or
// overlapping are left alone (the later one wins where they overlap).
func TestMergeDataSegments(t *testing.T) {
	ctx := context.Background()
	r := wazero.NewRuntime(ctx)
	defer r.Close(ctx)
	wasi_snapshot_preview1.MustInstantiate(ctx, r)

	// Gaps wider than the segments' headers: merged in place. Narrower: the bytes would
	// overtake those still to be moved, so into a new buffer.
	for _, c := range []struct {
		bin     []byte
		inPlace bool
	}{
		{withData(16, "ab", 32, "cd\x00e", 9000, "f", 9012, "gh", 1<<16-3, "xyz"), true},
		{withData(16, "ab", 20, "cd\x00e", 9000, "f", 9003, "gh", 1<<16-3, "xyz"), false},
	} {
		bin := c.bin
		fresh := mergeDataSegments(slices.Clip(slices.Clone(bin)))
		if got := dataSegments(t, fresh); got != 3 {
			t.Fatalf("%d segments after merging, want 3", got)
		}
		if !bytes.Equal(initialMemory(t, r, fresh), initialMemory(t, r, bin)) {
			t.Fatal("the merged module starts with other memory")
		}
		roomy := append(make([]byte, 0, len(bin)+rewriteSlack), bin...)
		merged := mergeDataSegments(roomy)
		if (&merged[0] == &roomy[0]) != c.inPlace || !bytes.Equal(merged, fresh) {
			t.Fatalf("merged in place %v, want %v; the same as into a new buffer: %v", &merged[0] == &roomy[0], c.inPlace, bytes.Equal(merged, fresh))
		}
	}
	for _, bad := range [][]byte{
		withData(16, "abcd", 18, "xy"), // overlapping
		withData(32, "ab", 16, "cd"),   // out of order
		withData(16, "ab"),             // nothing to merge
		tinyModule(),                   // no data section
	} {
		if got := mergeDataSegments(slices.Clone(bad)); !bytes.Equal(got, bad) {
			t.Fatalf("changed %x\ninto %x", bad, got)
		}
	}
}

// TestMergeDataSegmentsPython: python.wasm, merged as pythonModule merges it, starts with
// the same memory as python.wasm (wazero's interpreter, to spare a compilation).
func TestMergeDataSegmentsPython(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	ctx := context.Background()
	path, _ := tp.PythonPath()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	bin := withoutTrailingCustomSections(raw)
	merged := mergeDataSegments(append(make([]byte, 0, len(bin)+rewriteSlack), bin...))
	before, after := dataSegments(t, bin), dataSegments(t, merged)
	t.Logf("python.wasm: %d data segments, %d merged; %d bytes, %d merged", before, after, len(bin), len(merged))
	if after >= before || after > 100 {
		t.Fatalf("%d data segments after merging, from %d", after, before)
	}
	r := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer r.Close(ctx)
	wasi_snapshot_preview1.MustInstantiate(ctx, r)
	if !bytes.Equal(initialMemory(t, r, merged), initialMemory(t, r, bin)) {
		t.Fatal("merged python.wasm starts with other memory")
	}
}
