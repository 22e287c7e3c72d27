package wasm

import (
	"fmt"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// python.wasm's data section holds 24,171 active segments (one per C object, 7.2 MB),
// and wazero decodes each into an allocation of its own and applies each at every
// instantiation: about half of the decoding of python.wasm that every process compiling
// it pays (a one-shot roche run), and a third of each instantiation (every run, and every
// warm interpreter a pool refills). mergeDataSegments writes runs of them as one segment
// each, the gaps between them zero, which is what a new instance's memory holds there:
// the memory an instance starts with is the same byte for byte.

// maxDataGap is the largest gap between two segments written as zeros into one.
const maxDataGap = 4096

// dataSegment is an active segment of memory 0 at a constant offset: where its bytes go
// (off) and where they are in the module (at, size).
type dataSegment struct {
	off, size uint32
	at        int
}

// mergeDataSegments returns bin (a module without trailing custom sections) with runs of
// its data segments merged, in place when bin's capacity allows (rewriteSlack), so bin is
// not to be used after. It returns bin unchanged unless the data section is the last
// section and holds only active segments of memory 0 at constant offsets, in order and
// not overlapping, and no data count section counts them.
func mergeDataSegments(bin []byte) []byte {
	secs, find, err := moduleSections(bin)
	if err != nil || len(secs) == 0 || secs[len(secs)-1].id != 11 || find(12) != nil || find(8) != nil {
		return bin
	}
	ds := secs[len(secs)-1]
	r := &wreader{b: bin[:ds.end], off: ds.start}
	n := r.u32()
	if !r.ok() || uint64(n) > uint64(ds.end-ds.start) {
		return bin
	}
	segs := make([]dataSegment, 0, n)
	for range n {
		if r.u32() != 0 || r.byte() != 0x41 {
			return bin // passive, another memory, or not an i32.const offset
		}
		off, ok := r.s32()
		if !ok || r.byte() != 0x0b {
			return bin
		}
		size := r.u32()
		at := r.off
		r.bytes(int(size))
		if !r.ok() {
			return bin
		}
		if k := len(segs); k > 0 && uint64(off) < uint64(segs[k-1].off)+uint64(segs[k-1].size) {
			return bin // out of order or overlapping: the later would win where they overlap
		}
		segs = append(segs, dataSegment{off: uint32(off), size: size, at: at})
	}
	if r.off != ds.end {
		return bin
	}
	// Runs of segments no more than maxDataGap apart: [first, last] each.
	type run struct{ first, last int }
	var runs []run
	for k, s := range segs {
		if k > 0 {
			prev := segs[k-1]
			if uint64(s.off)-(uint64(prev.off)+uint64(prev.size)) <= maxDataGap {
				runs[len(runs)-1].last = k
				continue
			}
		}
		runs = append(runs, run{k, k})
	}
	if len(runs) == len(segs) {
		return bin
	}
	runHeader := func(rn run) []byte {
		h := []byte{0, 0x41}
		h = appendSLEB32(h, int32(segs[rn.first].off))
		h = append(h, 0x0b)
		return appendULEB(h, segs[rn.last].off+segs[rn.last].size-segs[rn.first].off)
	}
	// Where everything goes: the section's header from where the old one was, then the
	// count, then each run's header and bytes; dst[k] is where segment k's bytes go.
	payload := len(appendULEB(nil, uint32(len(runs))))
	for _, rn := range runs {
		payload += len(runHeader(rn)) + int(segs[rn.last].off+segs[rn.last].size-segs[rn.first].off)
	}
	headerAt := ds.start - len(appendULEB(nil, uint32(ds.end-ds.start))) - 1
	front := appendULEB(appendULEB([]byte{11}, uint32(payload)), uint32(len(runs)))
	total := headerAt + len(front) + payload - len(appendULEB(nil, uint32(len(runs))))
	dst := make([]int, len(segs))
	// Written from the last segment back, in place, each segment's bytes, the zeros
	// after them and a run's header must land at or after the end of every segment's
	// bytes still to be moved: checked first, else into a new buffer.
	inPlace := cap(bin) >= total
	pos := headerAt + len(front)
	for _, rn := range runs {
		pos += len(runHeader(rn))
		if rn.first > 0 && pos-len(runHeader(rn)) < segs[rn.first-1].at+int(segs[rn.first-1].size) {
			inPlace = false
		}
		base := pos
		for k := rn.first; k <= rn.last; k++ {
			dst[k] = base + int(segs[k].off-segs[rn.first].off)
			if dst[k] < segs[k].at {
				inPlace = false
			}
		}
		pos = base + int(segs[rn.last].off+segs[rn.last].size-segs[rn.first].off)
	}
	var out []byte
	if inPlace {
		out = bin[:total]
	} else {
		out = make([]byte, total)
		copy(out, bin[:headerAt])
	}
	for i := len(runs) - 1; i >= 0; i-- {
		rn := runs[i]
		for k := rn.last; k >= rn.first; k-- {
			if k < rn.last {
				clear(out[dst[k]+int(segs[k].size) : dst[k+1]])
			}
			copy(out[dst[k]:dst[k]+int(segs[k].size)], bin[segs[k].at:segs[k].at+int(segs[k].size)])
		}
		h := runHeader(rn)
		copy(out[dst[rn.first]-len(h):], h)
	}
	copy(out[headerAt:], front)
	return out
}

// s32 reads a signed LEB128 of at most 32 bits (an i32.const's immediate).
func (r *wreader) s32() (int32, bool) {
	var v int64
	var shift uint
	for i := 0; i < 5; i++ {
		c := r.byte()
		if !r.ok() {
			return 0, false
		}
		v |= int64(c&0x7f) << shift
		shift += 7
		if c&0x80 == 0 {
			if shift < 64 && c&0x40 != 0 {
				v |= -1 << shift
			}
			if v < -1<<31 || v > 1<<31-1 {
				return 0, false
			}
			return int32(v), true
		}
	}
	return 0, false
}

func appendSLEB32(b []byte, v int32) []byte {
	x := int64(v)
	for {
		c := byte(x & 0x7f)
		x >>= 7
		if x == 0 && c&0x40 == 0 || x == -1 && c&0x40 != 0 {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// python.wasm's data (7.2 MB, the C objects' initial values) is also kept out of the
// module that is compiled, and written by the host into each new instance's memory
// (Provider.instantiate) where wazero would have applied it: wazero hashes every byte of a
// module it compiles (the module's id, the compilation cache's key) and decodes each
// segment into an allocation of its own, which a process pays even when the compiled
// code comes from the disk cache (~13 ms of a one-shot run, half of the module's bytes).
// Without a data section the module is valid as long as no data count section counts
// segments (nothing then can refer to one: memory.init and data.drop need it), and an
// instance's memory is the same once the host has written them, before any of the
// module's code runs: a module with a start section (which wazero runs as it
// instantiates) is left whole, and no exported start function is called at
// instantiation (moduleConfig).

// memorySegment is an active data segment: bytes written at off in memory 0.
type memorySegment struct {
	off  uint32
	data []byte
}

// compiledPython is python.wasm's compiled module and the data segments kept out of it.
type compiledPython struct {
	module wazero.CompiledModule
	segs   []memorySegment
}

// splitData returns bin (a module without trailing custom sections) without its data
// section, and that section's segments (slices of bin), when it is the last section,
// holds only active segments of memory 0 at constant offsets, no data count section
// counts them and no start section runs code before the host writes them; else ok is
// false.
func splitData(bin []byte) (mod []byte, segs []memorySegment, ok bool) {
	secs, find, err := moduleSections(bin)
	if err != nil || len(secs) == 0 || secs[len(secs)-1].id != 11 || find(12) != nil || find(8) != nil {
		return nil, nil, false
	}
	ds := secs[len(secs)-1]
	r := &wreader{b: bin[:ds.end], off: ds.start}
	n := r.u32()
	if !r.ok() || uint64(n) > uint64(ds.end-ds.start) {
		return nil, nil, false
	}
	segs = make([]memorySegment, 0, n)
	for range n {
		if r.u32() != 0 || r.byte() != 0x41 {
			return nil, nil, false
		}
		off, ok := r.s32()
		if !ok || r.byte() != 0x0b {
			return nil, nil, false
		}
		data := r.bytes(int(r.u32()))
		if !r.ok() {
			return nil, nil, false
		}
		segs = append(segs, memorySegment{off: uint32(off), data: data})
	}
	if r.off != ds.end {
		return nil, nil, false
	}
	headerAt := ds.start - len(appendULEB(nil, uint32(ds.end-ds.start))) - 1
	return bin[:headerAt:headerAt], segs, true
}

// writeData writes segs into inst's memory, as instantiation applies active segments,
// in order; it fails, as an instantiation would, when one does not fit.
func writeData(inst api.Module, segs []memorySegment) error {
	mem := inst.Memory()
	for _, s := range segs {
		if mem == nil || !mem.Write(s.off, s.data) {
			return fmt.Errorf("python.wasm's data segment at %d (%d bytes) is out of its memory's bounds", s.off, len(s.data))
		}
	}
	return nil
}
