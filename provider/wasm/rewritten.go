package wasm

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"

	"github.com/roche-sandbox/roche/internal/buildinfo"
	"github.com/roche-sandbox/roche/provider/internal/statedir"
)

// rewrittenFile, in the state directory, keeps python.wasm as it is compiled: without
// its DWARF, rewritten for the pre-initialised interpreter's entry (rewrite.go), its
// data segments merged and kept apart from the module (datamerge.go), after it. A
// one-shot run maps it (statedir.MapPrivate), hands the module to wazero as it is and
// writes the data into its instance from the mapping, instead of reading python.wasm's
// 13 MB into a fresh buffer (each page faulted in, then copied) and rewriting it: ~10 ms
// of a one-shot `roche run`'s CPU. It is read only when private to this user, as python-entry.json
// is, and names the python.wasm (pythonID), the Roche that made it and its rewrite
// (rewriteVersion): another version of any makes it again. wazero's compilation cache keys the compiled code by these
// same bytes, so both kinds of read find the same compiled code.
const (
	rewrittenFile = "python-rewritten.wasm"
	// rewrittenMagic starts the file; its version changes with its layout, and a Roche
	// whose rewrite differs is told apart by the key in the header (rewrittenKey).
	rewrittenMagic = "roche-python-rewritten-1\n"
	// maxRewrittenFile bounds the file mapped (python.wasm's is 13.5 MB).
	maxRewrittenFile = 256 << 20
)

// rewrittenHeader follows rewrittenMagic: its length (4 bytes, little endian) and JSON.
// The module follows it (Module bytes), then the bytes of each of Data, in order.
type rewrittenHeader struct {
	Key    string             `json:"key"`
	Exits  []string           `json:"exits"`
	Module int                `json:"module"`
	Data   []rewrittenSegment `json:"data,omitempty"`
}

// rewrittenSegment is one of the module's data segments kept apart (splitData).
type rewrittenSegment struct {
	Off  uint32 `json:"off"`
	Size uint32 `json:"size"`
}

// rewrittenKey is rewrittenFile's key for the python.wasm named pythonID: with Roche's
// version and rewriteVersion, for a development build's version does not change with
// the rewrite.
func rewrittenKey(pythonID string) string {
	return buildinfo.Version() + "\x01" + rewriteVersion + "\x01" + pythonID
}

// pythonIdentity is pythonModule's id of the python.wasm at path, known without reading
// it: its pinned digest when it must be verified and this version of the file was
// (knownVerified), else its path and version stamp; "" when neither is known.
func (p *Provider) pythonIdentity(path string, verify bool) string {
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	stamp := fileStamp(fi)
	switch {
	case stamp == "":
		return ""
	case !verify:
		return path + "@" + stamp
	case p.knownVerified(path, stamp):
		return "sha256:" + pythonSHA256
	}
	return ""
}

// mappedRewritten is rewrittenFile mapped: the module, its exit candidates, and its data
// segments kept apart, which are slices of allData.
type mappedRewritten struct {
	module  []byte
	exits   []string
	data    []memorySegment
	allData []byte
	mapping *statedir.Mapping
}

// mapRewritten returns the module kept for the python.wasm named id, mapped; ok is false
// when there is none for it. Its mapping is the caller's to release.
func (p *Provider) mapRewritten(id string) (m mappedRewritten, ok bool) {
	file := filepath.Join(p.stateDir, rewrittenFile)
	b, mapping, err := statedir.MapPrivate(file, maxRewrittenFile)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			p.log.Debug("wasm: ignoring the rewritten python.wasm kept", "file", file, "err", err)
		}
		return m, false
	}
	h, rest, ok := parseRewritten(b, id)
	if !ok {
		mapping.Unmap()
		return m, false
	}
	m = mappedRewritten{module: rest[:h.Module:h.Module], exits: h.Exits, allData: rest[h.Module:], mapping: mapping}
	rest = m.allData
	for _, s := range h.Data {
		m.data = append(m.data, memorySegment{off: s.Off, data: rest[:s.Size:s.Size]})
		rest = rest[s.Size:]
	}
	return m, true
}

// keepData releases m's pages but its data's (its module's, once wazero has compiled
// it, copying what it keeps of it) and hands the rest to Close; false, all released,
// when Close has run.
func (p *Provider) keepData(m mappedRewritten) bool {
	m.mapping.Keep(m.allData)
	return p.keepMapping(m.mapping.Unmap)
}

// parseRewritten reads rewrittenFile's header from b, and checks it is for the
// python.wasm named id and that what it says follows it does: the header, and the rest.
func parseRewritten(b []byte, id string) (h rewrittenHeader, rest []byte, ok bool) {
	if !bytes.HasPrefix(b, []byte(rewrittenMagic)) || len(b) < len(rewrittenMagic)+4 {
		return h, nil, false
	}
	rest = b[len(rewrittenMagic):]
	n := binary.LittleEndian.Uint32(rest)
	rest = rest[4:]
	if uint64(n) > uint64(len(rest)) || json.Unmarshal(rest[:n], &h) != nil ||
		h.Key != rewrittenKey(id) || len(h.Exits) == 0 || len(h.Exits) > maxExitCandidates {
		return h, nil, false
	}
	rest = rest[n:]
	size := uint64(h.Module)
	for _, s := range h.Data {
		size += uint64(s.Size)
	}
	if h.Module < moduleHeaderSize || size != uint64(len(rest)) {
		return h, nil, false
	}
	return h, rest, true
}

// keepRewritten writes bin, the module compiled for the python.wasm named id with exits
// its exit candidates and data its data segments kept apart, to rewrittenFile for the
// next process.
func (p *Provider) keepRewritten(id string, bin []byte, exits []string, data []memorySegment) {
	h := rewrittenHeader{Key: rewrittenKey(id), Exits: exits, Module: len(bin)}
	parts := [][]byte{[]byte(rewrittenMagic), nil, nil, bin}
	for _, s := range data {
		h.Data = append(h.Data, rewrittenSegment{Off: s.off, Size: uint32(len(s.data))})
		parts = append(parts, s.data)
	}
	head, err := json.Marshal(h)
	if err != nil {
		return
	}
	parts[1], parts[2] = binary.LittleEndian.AppendUint32(nil, uint32(len(head))), head
	file := filepath.Join(p.stateDir, rewrittenFile)
	if err := statedir.WritePrivate(file, parts...); err != nil {
		p.log.Debug("wasm: keeping the rewritten python.wasm", "file", file, "err", err)
	}
}
