package wasm

import "io"

// moduleHeaderSize is a module's magic number and version, the 8 bytes before its
// sections.
const moduleHeaderSize = 8

// python.wasm ends in 13 MB of DWARF (.debug_info, .debug_str, ...) beside its 13 MB of
// code and data. Nothing here reads it (wazero runs with debug info off), but every
// process that compiled python.wasm read it from disk and had wazero hash it (sha256 of
// the whole binary, for the module's id and the compilation cache's key): some 25 ms of
// CPU of a one-shot roche run on a loaded 2-core machine, for half the bytes. Custom
// sections (id 0) mean nothing to a module's validation or execution, so python.wasm
// without those after its last other section is the same program; the compilation cache
// keeps it under the cut module's key.

// modulePrefix returns how many bytes of the module r (size bytes) come before its
// trailing custom sections, reading only section headers: size itself when it does not
// parse as a sequence of sections (wazero then reports what is wrong with it) or has no
// trailing custom section.
func modulePrefix(r io.ReaderAt, size int64) int64 {
	if size < moduleHeaderSize {
		return size
	}
	end := int64(moduleHeaderSize) // just past the last non-custom section seen
	var head [6]byte               // an id and a size of at most 5 bytes
	for off := int64(moduleHeaderSize); off < size; {
		n, err := r.ReadAt(head[:min(int64(len(head)), size-off)], off)
		if n < 2 && err != nil {
			return size
		}
		sectionSize, m := uleb32(head[1:n])
		if m == 0 {
			return size
		}
		next := off + 1 + int64(m) + int64(sectionSize)
		if next > size {
			return size
		}
		if head[0] != 0 {
			end = next
		}
		off = next
	}
	return end
}

// withoutTrailingCustomSections is bin cut before its trailing custom sections
// (modulePrefix), sharing its array.
func withoutTrailingCustomSections(bin []byte) []byte {
	return bin[:modulePrefix(bytesReaderAt(bin), int64(len(bin)))]
}

type bytesReaderAt []byte

func (b bytesReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if off >= int64(len(b)) {
		return 0, io.EOF
	}
	n := copy(p, b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// uleb32 decodes an unsigned LEB128 of at most 32 bits (5 bytes) from b: the value and the
// bytes it took, or 0 bytes when b does not start with one.
func uleb32(b []byte) (uint32, int) {
	var v uint32
	for i := 0; i < 5 && i < len(b); i++ {
		c := b[i]
		if i == 4 && c > 0x0f {
			return 0, 0 // more than 32 bits
		}
		v |= uint32(c&0x7f) << (7 * i)
		if c&0x80 == 0 {
			return v, i + 1
		}
	}
	return 0, 0
}
