package wasm

import (
	"sync"

	"github.com/tetratelabs/wazero/experimental"
)

// wasmPage is the WebAssembly page size.
const wasmPage = 64 << 10

// maxLinearMemory is the most a 32-bit module can address.
const maxLinearMemory = 1 << 32

// memoryCap is a wazero memory allocator that holds one instantiation's linear memory
// to a byte limit and records whether the guest was refused memory.
//
// The limit is applied per instantiation rather than with
// RuntimeConfig.WithMemoryLimitPages because that setting belongs to the runtime and is
// baked into each module when it is compiled: per-sandbox limits would need a runtime
// and a compilation of python.wasm for every distinct limit. It also could not tell us
// that the limit was hit, and this can: a refused memory.grow is exactly that event.
type memoryCap struct {
	limit uint64

	mu      sync.Mutex
	refused bool // a grow past the limit was refused
	initial bool // the module's declared minimum alone exceeded the limit
}

func newMemoryCap(limit int64) *memoryCap {
	l := uint64(max(limit, 0))
	l = min(l, maxLinearMemory)
	l -= l % wasmPage // a partial page can never be granted
	return &memoryCap{limit: l}
}

// Allocate implements experimental.MemoryAllocator.
func (c *memoryCap) Allocate(capacity, _ uint64) experimental.LinearMemory {
	return &cappedMemory{cap: c, hint: capacity}
}

// Refused reports whether the guest asked for memory beyond the limit.
func (c *memoryCap) Refused() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.refused
}

// OverAtStart reports whether the module's minimum memory was already over the limit.
func (c *memoryCap) OverAtStart() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.initial
}

// cappedMemory is one linear memory. It grows like append, doubling capacity up to the
// limit, so that a guest growing page by page does not copy its memory each time.
type cappedMemory struct {
	cap  *memoryCap
	hint uint64
	buf  []byte
}

// Reallocate implements experimental.LinearMemory. wazero asks for the module's minimum
// first and indexes the result without checking, so that first request is never refused
// (a nil there would panic inside wazero); instead it is flagged and the exec refuses to
// start the module. Later requests past the limit get nil, which the guest sees as a
// failed memory.grow.
func (m *cappedMemory) Reallocate(size uint64) []byte {
	first := m.buf == nil
	if size > m.cap.limit {
		m.cap.mu.Lock()
		if first {
			m.cap.initial = true
		} else {
			m.cap.refused = true
		}
		m.cap.mu.Unlock()
		if !first {
			return nil
		}
	}
	if size <= uint64(cap(m.buf)) && !first {
		m.buf = m.buf[:size]
		return m.buf
	}
	newCap := max(size, uint64(cap(m.buf))*2, min(m.hint, m.cap.limit))
	if size <= m.cap.limit {
		newCap = min(newCap, m.cap.limit)
	}
	// Fresh memory from make is zeroed, as memory.grow requires of new pages.
	buf := make([]byte, size, newCap)
	copy(buf, m.buf)
	m.buf = buf
	return buf
}

// Free implements experimental.LinearMemory.
func (m *cappedMemory) Free() { m.buf = nil }
