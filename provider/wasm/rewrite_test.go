package wasm

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
	"github.com/tetratelabs/wazero/sys"
)

// tinyModule is a module shaped like python.wasm where the rewrite looks: its one
// global is the stack pointer, proc_exit is imported, function 2 (no parameters, no
// result) exits with status 120 as Py_Exit can, and the table's entry 1 is function 3,
// which adds its three parameters.
func tinyModule() []byte {
	section := func(id byte, payload ...byte) []byte {
		return append(appendULEB([]byte{id}, uint32(len(payload))), payload...)
	}
	m := []byte("\x00asm\x01\x00\x00\x00")
	m = append(m, section(1, 4,
		0x60, 0, 0,
		0x60, 3, 0x7f, 0x7f, 0x7f, 1, 0x7f,
		0x60, 4, 0x7f, 0x7f, 0x7f, 0x7f, 1, 0x7f,
		0x60, 1, 0x7f, 0)...)
	imp := []byte{1, 22}
	imp = append(imp, wasiModule...)
	imp = append(imp, 9)
	imp = append(imp, "proc_exit"...)
	imp = append(imp, 0, 3)
	m = append(m, section(2, imp...)...)
	m = append(m, section(3, 3, 0, 0, 1)...)
	m = append(m, section(4, 1, 0x70, 0, 2)...)
	m = append(m, section(5, 1, 0, 1)...)
	m = append(m, section(6, 1, 0x7f, 1, 0x41, 0x80, 0x80, 0x04, 0x0b)...)
	exp := []byte{2, 6}
	exp = append(exp, "_start"...)
	exp = append(exp, 0, 1, 6)
	exp = append(exp, "memory"...)
	exp = append(exp, 2, 0)
	m = append(m, section(7, exp...)...)
	m = append(m, section(9, 1, 0, 0x41, 1, 0x0b, 1, 3)...)
	m = append(m, section(10, 3,
		2, 0, 0x0b,
		7, 0, 0x41, 0xf8, 0x00, 0x10, 0, 0x0b,
		10, 0, 0x20, 0, 0x20, 1, 0x6a, 0x20, 2, 0x6a, 0x0b)...)
	return m
}

// TestRewriteForEntry: the analysis finds the exit, and the rewritten module, compiled
// and run by wazero, exports the stack pointer, calls through the table, and exits.
func TestRewriteForEntry(t *testing.T) {
	ctx := context.Background()
	bin := tinyModule()
	layout, err := analyseEntry(bin)
	if err != nil {
		t.Fatalf("analyseEntry: %v", err)
	}
	if want := (entryLayout{Call3: 1, Call4: 2, Exits: []uint32{2}}); layout.Call3 != want.Call3 || layout.Call4 != want.Call4 || !slices.Equal(layout.Exits, want.Exits) {
		t.Fatalf("layout %+v, want %+v", layout, want)
	}
	out, names, err := rewriteForEntry(bin, layout)
	if err != nil {
		t.Fatalf("rewriteForEntry: %v", err)
	}
	if !slices.Equal(names, []string{preinitExitPrefix + "0"}) {
		t.Fatalf("names %q", names)
	}
	r := wazero.NewRuntime(ctx)
	defer r.Close(ctx)
	wasi_snapshot_preview1.MustInstantiate(ctx, r)
	mod, err := r.InstantiateWithConfig(ctx, out, wazero.NewModuleConfig().WithStartFunctions())
	if err != nil {
		t.Fatalf("the rewritten module: %v", err)
	}
	if sp := mod.ExportedGlobal(preinitSP); sp == nil || sp.Get() != 65536 {
		t.Fatalf("stack pointer export: %v", sp)
	}
	res, err := mod.ExportedFunction(preinitCall).Call(ctx, 1, 2, 3, 4)
	if err != nil || res[0] != 9 {
		t.Fatalf("%s(1, 2, 3, 4) = %v, %v; want 9", preinitCall, res, err)
	}
	_, err = mod.ExportedFunction(names[0]).Call(ctx)
	var exit *sys.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 120 {
		t.Fatalf("%s: %v, want exit 120", names[0], err)
	}
	// A layout naming what the module does not have is refused, not written.
	for _, bad := range []entryLayout{{Call3: 9, Call4: 2, Exits: []uint32{2}}, {Call3: 1, Call4: 2, Exits: []uint32{7}}, {Call3: 1, Call4: 2}} {
		if _, _, err := rewriteForEntry(bin, bad); err == nil {
			t.Fatalf("layout %+v accepted", bad)
		}
	}
	// A module without a proc_exit import, or a body with an unknown instruction, has none.
	if _, err := analyseEntry(bin[:len(bin)-3]); err == nil {
		t.Fatal("a truncated module was analysed")
	}
}

// TestRewriteInPlace: with room after the module, the rewrite reuses its buffer and
// writes the same bytes as into a new one.
func TestRewriteInPlace(t *testing.T) {
	bin := tinyModule()
	layout, err := analyseEntry(bin)
	if err != nil {
		t.Fatal(err)
	}
	fresh, _, err := rewriteForEntry(slices.Clip(slices.Clone(bin)), layout)
	if err != nil {
		t.Fatal(err)
	}
	roomy := append(make([]byte, 0, len(bin)+rewriteSlack), bin...)
	inPlace, _, err := rewriteForEntry(roomy, layout)
	if err != nil {
		t.Fatal(err)
	}
	if &inPlace[0] != &roomy[0] {
		t.Fatal("not rewritten in place")
	}
	if !slices.Equal(inPlace, fresh) {
		t.Fatalf("in place:\n%x\nnew buffer:\n%x", inPlace, fresh)
	}
}
