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
// its DWARF, rewritten for the pre-initialised interpreter's entry (rewrite.go) and its
// data segments merged (datamerge.go). A one-shot run maps it (statedir.MapPrivate)
// and hands it to wazero as it is, instead of reading python.wasm's 13 MB into a fresh
// buffer (each page faulted in, then copied) and rewriting it: ~10 ms of a one-shot
// `roche run`'s CPU. It is read only when private to this user, as python-entry.json
// is, and names the python.wasm (pythonID) and the Roche that made it: another version
// of either makes it again. wazero's compilation cache keys the compiled code by these
// same bytes, so both kinds of read find the same compiled code.
const (
	rewrittenFile = "python-rewritten.wasm"
	// rewrittenMagic starts the file; its version changes with its layout, and a Roche
	// whose rewrite differs is told apart by its version in the header.
	rewrittenMagic = "roche-python-rewritten-1\n"
	// maxRewrittenFile bounds the file mapped (python.wasm's is 13.5 MB).
	maxRewrittenFile = 256 << 20
)

// rewrittenHeader follows rewrittenMagic: its length (4 bytes, little endian) and JSON.
// The module follows it.
type rewrittenHeader struct {
	Key   string   `json:"key"`
	Exits []string `json:"exits"`
}

func rewrittenKey(pythonID string) string { return buildinfo.Version() + "\x01" + pythonID }

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

// mapRewritten returns the module kept for the python.wasm named id, mapped (unmap
// releases it once compiled), with its exit candidates; ok is false when there is none
// for it.
func (p *Provider) mapRewritten(id string) (bin []byte, exits []string, unmap func(), ok bool) {
	file := filepath.Join(p.stateDir, rewrittenFile)
	b, unmap, err := statedir.MapPrivate(file, maxRewrittenFile)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			p.log.Debug("wasm: ignoring the rewritten python.wasm kept", "file", file, "err", err)
		}
		return nil, nil, nil, false
	}
	var h rewrittenHeader
	if !bytes.HasPrefix(b, []byte(rewrittenMagic)) || len(b) < len(rewrittenMagic)+4 {
		unmap()
		return nil, nil, nil, false
	}
	rest := b[len(rewrittenMagic):]
	n := binary.LittleEndian.Uint32(rest)
	rest = rest[4:]
	if uint64(n) > uint64(len(rest)) || json.Unmarshal(rest[:n], &h) != nil ||
		h.Key != rewrittenKey(id) || len(h.Exits) == 0 || len(h.Exits) > maxExitCandidates {
		unmap()
		return nil, nil, nil, false
	}
	return rest[n:], h.Exits, unmap, true
}

// keepRewritten writes bin, the module compiled for the python.wasm named id with exits
// its exit candidates, to rewrittenFile for the next process.
func (p *Provider) keepRewritten(id string, bin []byte, exits []string) {
	head, err := json.Marshal(rewrittenHeader{Key: rewrittenKey(id), Exits: exits})
	if err != nil {
		return
	}
	file := filepath.Join(p.stateDir, rewrittenFile)
	err = statedir.WritePrivate(file, []byte(rewrittenMagic), binary.LittleEndian.AppendUint32(nil, uint32(len(head))), head, bin)
	if err != nil {
		p.log.Debug("wasm: keeping the rewritten python.wasm", "file", file, "err", err)
	}
}
