package wasm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// A pre-initialised interpreter (preinit.go) enters CPython again from a copy of its
// memory, which python.wasm alone does not allow: it exports only _start (which starts
// CPython from scratch) and keeps its C stack pointer, its one global, to itself. Its
// DWARF would name the functions, but the build left every address in it zero, and it
// has no name section. rewriteForEntry adds to the module, without changing anything it
// had, what the host needs to go in again:
//   - the stack pointer exported as preinitSP;
//   - preinitCall, a function (idx, a, b, c) that calls the table's entry idx with
//     (a, b, c): any C function of type (i32, i32, i32) -> i32 CPython stores a pointer
//     to, such as a Python type's tp_call, whose table index the host reads from the
//     copied memory;
//   - the candidates for CPython's handle_system_exit, exported as preinitExitPrefix+N:
//     the functions with no parameters and no result that call, directly or one or two
//     calls down, the function ending in WASI's proc_exit, and use the constant 120
//     (Py_Exit's status when finalisation fails). Which one is CPython's is found by
//     running them (preinit.go checks the candidate exits as CPython would), not trusted
//     from this shape.

const (
	// rewriteVersion names what this code makes of python.wasm: the module rewritten
	// here, its data merged and kept apart (datamerge.go), and the pre-initialised copies
	// of its memory (preinit.go). It is in the keys of what the state directory keeps of
	// them (python-rewritten.wasm, the copies), beside Roche's version, which is the same
	// for every development build of a commit ("-devel", "+dirty"): bump it with any
	// change to what rewriteForEntry, mergeDataSegments, splitData or makePreinit make,
	// so that a build with the change does not run what one without it kept.
	rewriteVersion = "1"

	preinitSP         = "roche_stack_pointer"
	preinitCall       = "roche_call3"
	preinitExitPrefix = "roche_exit_"
	// maxExitCandidates bounds the candidates tried.
	maxExitCandidates = 4
	// rewriteSlack is the room readPython leaves after the module for rewriteForEntry
	// and mergeDataSegments to grow it in place (python.wasm's merged data segments take
	// ~330 KB more, the zeros between them).
	rewriteSlack = 1 << 20
)

var errNoEntry = errors.New("python.wasm's layout is not the one a pre-initialised interpreter needs")

// entryLayout is what rewriteForEntry needs to know of python.wasm, found by
// analyseEntry (which decodes every function body: tens of milliseconds, so its result
// is kept on disk, see python.go).
type entryLayout struct {
	Call3 uint32   `json:"call3"` // the type (i32 i32 i32) -> i32
	Call4 uint32   `json:"call4"` // the type (i32 i32 i32 i32) -> i32
	Exits []uint32 `json:"exits"` // the exit candidates' function indices
}

type wasmSection struct {
	id         byte
	start, end int // the payload
}

// moduleSections splits a module into its sections, and finds those the rewrite needs.
func moduleSections(bin []byte) (secs []wasmSection, find func(byte) *wasmSection, err error) {
	if len(bin) < moduleHeaderSize || string(bin[:4]) != "\x00asm" {
		return nil, nil, errNoEntry
	}
	for off := moduleHeaderSize; off < len(bin); {
		id := bin[off]
		size, n := uleb32(bin[off+1 : min(off+6, len(bin))])
		if n == 0 || off+1+n+int(size) > len(bin) {
			return nil, nil, errNoEntry
		}
		secs = append(secs, wasmSection{id, off + 1 + n, off + 1 + n + int(size)})
		off += 1 + n + int(size)
	}
	find = func(id byte) *wasmSection {
		for i := range secs {
			if secs[i].id == id {
				return &secs[i]
			}
		}
		return nil
	}
	for _, id := range []byte{1, 2, 3, 4, 6, 7, 10} {
		if find(id) == nil {
			return nil, nil, errNoEntry
		}
	}
	return secs, find, nil
}

// analyseEntry finds the entryLayout of bin, a module without trailing custom sections.
func analyseEntry(bin []byte) (entryLayout, error) {
	_, find, err := moduleSections(bin)
	if err != nil {
		return entryLayout{}, err
	}
	typeSec, importSec, funcSec, tableSec, globalSec, codeSec :=
		find(1), find(2), find(3), find(4), find(6), find(10)
	r := &wreader{b: bin[:typeSec.end], off: typeSec.start}
	// Types: find (i32 i32 i32) -> i32 and (i32 i32 i32 i32) -> i32, and () -> ().
	call3, call4, void := -1, -1, -1
	for i, n := 0, r.u32(); i < int(n) && r.ok(); i++ {
		if r.byte() != 0x60 {
			return entryLayout{}, errNoEntry
		}
		params := r.bytes(int(r.u32()))
		results := r.bytes(int(r.u32()))
		switch {
		case bytes.Equal(params, []byte{0x7f, 0x7f, 0x7f}) && bytes.Equal(results, []byte{0x7f}) && call3 < 0:
			call3 = i
		case bytes.Equal(params, []byte{0x7f, 0x7f, 0x7f, 0x7f}) && bytes.Equal(results, []byte{0x7f}) && call4 < 0:
			call4 = i
		case len(params) == 0 && len(results) == 0 && void < 0:
			void = i
		}
	}
	if !r.ok() || call3 < 0 || call4 < 0 || void < 0 {
		return entryLayout{}, errNoEntry
	}
	// Imports: count the functions, find proc_exit; no imported globals or tables, so
	// the stack pointer is global 0 and the table table 0.
	r = &wreader{b: bin[:importSec.end], off: importSec.start}
	imported, procExit := 0, -1
	for i, n := 0, r.u32(); i < int(n) && r.ok(); i++ {
		mod := string(r.bytes(int(r.u32())))
		name := string(r.bytes(int(r.u32())))
		switch r.byte() {
		case 0:
			r.u32()
			if mod == wasiModule && name == "proc_exit" {
				procExit = imported
			}
			imported++
		default:
			return entryLayout{}, errNoEntry // a table, memory or global imported
		}
	}
	if !r.ok() || procExit < 0 {
		return entryLayout{}, errNoEntry
	}
	r = &wreader{b: bin[:globalSec.end], off: globalSec.start}
	if r.u32() != 1 || r.byte() != 0x7f || r.byte() != 1 || !r.ok() {
		return entryLayout{}, errNoEntry // not one mutable i32
	}
	r = &wreader{b: bin[:tableSec.end], off: tableSec.start}
	if r.u32() != 1 || !r.ok() {
		return entryLayout{}, errNoEntry
	}
	// Defined functions' types and bodies.
	r = &wreader{b: bin[:funcSec.end], off: funcSec.start}
	nfuncs := int(r.u32())
	types := make([]uint32, 0, nfuncs)
	for range nfuncs {
		types = append(types, r.u32())
	}
	if !r.ok() {
		return entryLayout{}, errNoEntry
	}
	r = &wreader{b: bin[:codeSec.end], off: codeSec.start}
	if int(r.u32()) != nfuncs {
		return entryLayout{}, errNoEntry
	}
	calls := make([][]uint32, nfuncs)
	has120 := make([]bool, nfuncs)
	for i := range nfuncs {
		body := r.bytes(int(r.u32()))
		if !r.ok() {
			return entryLayout{}, errNoEntry
		}
		var ok bool
		calls[i], has120[i], ok = scanBody(body)
		if !ok {
			return entryLayout{}, errNoEntry
		}
	}
	// The functions reaching proc_exit within three calls.
	reaches := map[uint32]bool{uint32(procExit): true}
	for range 3 {
		for i, cs := range calls {
			for _, c := range cs {
				if reaches[c] {
					reaches[uint32(imported+i)] = true
					break
				}
			}
		}
	}
	layout := entryLayout{Call3: uint32(call3), Call4: uint32(call4)}
	for i, cs := range calls {
		if int(types[i]) != void || !has120[i] {
			continue
		}
		for _, c := range cs {
			if reaches[c] {
				layout.Exits = append(layout.Exits, uint32(imported+i))
				break
			}
		}
	}
	if len(layout.Exits) == 0 || len(layout.Exits) > maxExitCandidates {
		return entryLayout{}, errNoEntry
	}
	return layout, nil
}

// rewriteForEntry returns bin (a module without trailing custom sections) with the
// exports above, and the names of the exit candidates in the order to try them. It
// checks layout only as far as keeping the module valid needs: the indices exist. It
// rewrites bin in place when its capacity allows (rewriteSlack), so bin is not to be
// used after a success.
func rewriteForEntry(bin []byte, layout entryLayout) ([]byte, []string, error) {
	secs, find, err := moduleSections(bin)
	if err != nil {
		return nil, nil, err
	}
	count := func(sec *wasmSection) uint32 {
		r := &wreader{b: bin[:sec.end], off: sec.start}
		return r.u32()
	}
	ntypes := count(find(1))
	imported := uint32(0)
	r := &wreader{b: bin[:find(2).end], off: find(2).start}
	for i, n := 0, r.u32(); i < int(n) && r.ok(); i++ {
		r.bytes(int(r.u32()))
		r.bytes(int(r.u32()))
		if r.byte() != 0 {
			return nil, nil, errNoEntry
		}
		r.u32()
		imported++
	}
	nfuncs := count(find(3))
	if !r.ok() || layout.Call3 >= ntypes || layout.Call4 >= ntypes || len(layout.Exits) == 0 || len(layout.Exits) > maxExitCandidates {
		return nil, nil, errNoEntry
	}
	for _, e := range layout.Exits {
		if e < imported || e >= imported+nfuncs {
			return nil, nil, errNoEntry
		}
	}
	candidates, call3, call4 := layout.Exits, layout.Call3, layout.Call4

	// The new function: preinitCall.
	newFunc := imported + nfuncs
	var body []byte
	body = append(body, 0) // no locals
	for _, l := range []byte{1, 2, 3, 0} {
		body = append(body, 0x20, l) // local.get
	}
	body = append(body, 0x11)
	body = appendULEB(body, uint32(call3))
	body = append(body, 0x00, 0x0b) // table 0, end

	// Each changed section is its count, renewed, then what it had after its count,
	// then what is added: written straight into one buffer of the final size, since
	// python.wasm is 13 MB and every one-shot run rewrites it.
	type change struct{ head, tail []byte }
	var names []string
	changes := map[byte]*change{}
	countOf := func(id byte, add uint32) (*change, []byte) {
		sec := find(id)
		pr := &wreader{b: bin[:sec.end], off: sec.start}
		n := pr.u32()
		c := &change{head: appendULEB(nil, n+add)}
		changes[id] = c
		return c, bin[pr.off:sec.end]
	}
	fc, _ := countOf(3, 1)
	fc.tail = appendULEB(nil, call4)
	cc, _ := countOf(10, 1)
	cc.tail = append(appendULEB(nil, uint32(len(body))), body...)
	ec, _ := countOf(7, 2+uint32(len(candidates)))
	ec.tail = appendExport(nil, preinitSP, 3, 0)
	ec.tail = appendExport(ec.tail, preinitCall, 0, newFunc)
	for i, c := range candidates {
		name := fmt.Sprintf("%s%d", preinitExitPrefix, i)
		names = append(names, name)
		ec.tail = appendExport(ec.tail, name, 0, c)
	}
	// Each section's new header, head, the bytes it keeps, and tail.
	type piece struct {
		header, head, rest, tail []byte
	}
	pieces := make([]piece, len(secs))
	size := moduleHeaderSize
	for i, s := range secs {
		rest := bin[s.start:s.end]
		var head, tail []byte
		if c := changes[s.id]; c != nil {
			pr := &wreader{b: rest}
			pr.u32()
			rest, head, tail = rest[pr.off:], c.head, c.tail
		}
		header := appendULEB([]byte{s.id}, uint32(len(head)+len(rest)+len(tail)))
		pieces[i] = piece{header, head, rest, tail}
		size += len(header) + len(head) + len(rest) + len(tail)
	}
	// In place when bin has the room (readPython leaves some): the sections only move
	// towards the end, so moving them from the last one back overwrites nothing still to
	// be moved, and python.wasm's 13 MB are not copied into a second buffer.
	var out []byte
	if cap(bin) >= size {
		out = bin[:size]
	} else {
		out = make([]byte, size)
		copy(out, bin[:moduleHeaderSize])
	}
	end := size
	for i := len(pieces) - 1; i >= 0; i-- {
		pc := pieces[i]
		end -= len(pc.tail)
		copy(out[end:], pc.tail)
		end -= len(pc.rest)
		copy(out[end:], pc.rest)
		end -= len(pc.head)
		copy(out[end:], pc.head)
		end -= len(pc.header)
		copy(out[end:], pc.header)
	}
	return out, names, nil
}

func appendExport(b []byte, name string, kind byte, idx uint32) []byte {
	b = appendULEB(b, uint32(len(name)))
	b = append(b, name...)
	b = append(b, kind)
	return appendULEB(b, idx)
}

func appendULEB(b []byte, v uint32) []byte {
	return binary.AppendUvarint(b, uint64(v))
}

// wreader reads a module's LEB128 numbers and bytes, remembering the first overrun.
type wreader struct {
	b   []byte
	off int
	bad bool
}

func (r *wreader) ok() bool { return !r.bad }

func (r *wreader) u32() uint32 {
	if r.bad || r.off >= len(r.b) {
		r.bad = true
		return 0
	}
	v, n := uleb32(r.b[r.off:min(r.off+5, len(r.b))])
	if n == 0 {
		r.bad = true
		return 0
	}
	r.off += n
	return v
}

func (r *wreader) byte() byte {
	if r.bad || r.off >= len(r.b) {
		r.bad = true
		return 0
	}
	r.off++
	return r.b[r.off-1]
}

func (r *wreader) bytes(n int) []byte {
	if r.bad || n < 0 || r.off+n > len(r.b) {
		r.bad = true
		return nil
	}
	r.off += n
	return r.b[r.off-n : r.off]
}

// skipLEB skips a LEB128 number of any width (signed or not).
func (r *wreader) skipLEB() {
	for !r.bad {
		if r.byte()&0x80 == 0 {
			return
		}
	}
}

// scanBody decodes a function body's instructions far enough to list the functions it
// calls and whether it has the constant i32 120. ok is false for an instruction it does
// not know (SIMD, or anything newer than bulk memory), or a body that does not parse.
func scanBody(body []byte) (calls []uint32, has120, ok bool) {
	r := &wreader{b: body}
	for i, n := 0, r.u32(); i < int(n) && r.ok(); i++ {
		r.u32()
		r.byte()
	}
	for r.ok() && r.off < len(r.b) {
		op := r.byte()
		switch {
		case op == 0x02 || op == 0x03 || op == 0x04: // block type
			r.skipLEB()
		case op == 0x0c || op == 0x0d || op >= 0x20 && op <= 0x26 || op == 0x3f || op == 0x40 || op == 0xd0 || op == 0xd2:
			r.u32()
		case op == 0x0e:
			n := r.u32()
			for j := uint32(0); j <= n && r.ok(); j++ {
				r.u32()
			}
		case op == 0x10 || op == 0x12:
			calls = append(calls, r.u32())
		case op == 0x11 || op == 0x13:
			r.u32()
			r.u32()
		case op == 0x1c:
			r.bytes(int(r.u32()))
		case op >= 0x28 && op <= 0x3e:
			r.u32()
			r.u32()
		case op == 0x41:
			start := r.off
			r.skipLEB()
			// 120 takes two bytes as a signed LEB128 (0x78 alone would be -8).
			if r.ok() && r.off-start == 2 && r.b[start] == 0xf8 && r.b[start+1] == 0x00 {
				has120 = true
			}
		case op == 0x42:
			r.skipLEB()
		case op == 0x43:
			r.bytes(4)
		case op == 0x44:
			r.bytes(8)
		case op == 0xfc:
			switch sub := r.u32(); {
			case sub <= 7:
			case sub == 8 || sub == 10 || sub == 12 || sub == 14:
				r.u32()
				r.u32()
			case sub <= 17:
				r.u32()
			default:
				return nil, false, false
			}
		case op <= 0x01 || op == 0x05 || op == 0x0b || op == 0x0f || op == 0x1a || op == 0x1b || op >= 0x45 && op <= 0xc4 || op == 0xd1:
		default:
			return nil, false, false
		}
	}
	return calls, has120, r.ok()
}
