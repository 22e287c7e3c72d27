package ledger

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Kind is what a tracked sandbox is to the daemon.
type Kind string

const (
	// KindPooled: idle in a warm pool, nobody's yet. After a crash it is a leftover and
	// is destroyed.
	KindPooled Kind = "pooled"
	// KindClient: handed to a client, kept until destroyed or expired.
	KindClient Kind = "client"
	// KindDestroying: destroy was requested and the removal is pending or failed; the
	// reaper retries it, and a restart finishes it.
	KindDestroying Kind = "destroying"
)

// Record is what the daemon knows of one sandbox. The persisted fields are exactly what
// a restarted daemon needs to keep serving the sandbox as before.
type Record struct {
	ID        string    `json:"id"`
	Provider  string    `json:"provider"`
	Image     string    `json:"image"`
	Kind      Kind      `json:"kind"`
	Pool      string    `json:"pool,omitempty"` // the pool it came from, for pooled and claimed ones
	CreatedAt time.Time `json:"created_at"`
	// ExpiresAt is the expiry the daemon enforces. For a sandbox from the pool it is
	// earlier than the one the provider knows (the pool made it to last longer).
	ExpiresAt time.Time `json:"expires_at"`
	// Env and Workdir are applied to each command: a pooled sandbox was made before the
	// client's create named them.
	Env     map[string]string `json:"env,omitempty"`
	Workdir string            `json:"workdir,omitempty"`
	Paused  bool              `json:"paused,omitempty"`
	// Tenant is whose sandbox it is ("" in a state file from before tenants: local).
	Tenant string `json:"tenant,omitempty"`
	// Leased: the client holds it with Hold, and it is destroyed once nobody does
	// (lease.go).
	Leased bool `json:"leased,omitempty"`

	// adopted: found on the engine without a record (see owner.go), for /metrics.
	adopted bool
	// direct: made in direct mode by roched's own user and served to it (direct.go):
	// never saved, reaped, leased or counted against a bound by roched. owner is its
	// own owner, which List and Inspect report.
	direct bool
	owner  string
	// since is when the daemon started tracking it, so that a reconcile does not drop a
	// record made after its listing was taken.
	since time.Time
	// removing: a destroy is in flight.
	removing bool
	// admitting: a pooled sandbox being handed to a client whose create still holds its
	// reservation (admit), which counts it against the bounds until the create ends; the
	// record does not count too.
	admitting bool
}

// TenantName is the record's tenant.
func (r *Record) TenantName() string {
	if r.Tenant == "" {
		return LocalTenant
	}
	return r.Tenant
}

// stateFile is the on-disk form.
type stateFile struct {
	Version int `json:"version"`
	// Instance is the daemon's owner id (see owner.go), kept so that a restarted daemon
	// is the same owner.
	Instance  string    `json:"instance,omitempty"`
	Sandboxes []*Record `json:"sandboxes"`
}

const stateVersion = 1

// store persists records atomically (write a temporary file, rename it over the old).
// It does not fsync: the failure it guards against is the daemon dying (kill -9, a
// crash), after which the kernel still writes the file out; a host crash takes every
// sandbox down with it, leaving nothing to recover.
type store struct {
	path     string
	instance string

	mu      sync.Mutex
	written uint64     // sequence number of the snapshot on disk
	writing bool       // a write is under way
	wrote   *sync.Cond // on mu: a write ended

	// encoded is each record's JSON as the last write made it, with the record it
	// encodes; only the one write under way (writing) uses it. A write encodes again
	// only the records that changed since: a claim from a pool of hundreds changes one,
	// and encoding every record at every change was most of a claim's CPU in roched.
	encoded map[string]*encodedRecord
	gen     uint64 // the write under way, for dropping records gone since
}

// encodedRecord is a record's JSON and the record as it was encoded, last used by write
// gen.
type encodedRecord struct {
	rec Record
	b   []byte
	gen uint64
}

// sameSaved reports whether two records save the same: every field the state file
// holds is equal (TestSameSavedCoversEveryField keeps this list whole).
func sameSaved(a, b *Record) bool {
	return a.ID == b.ID && a.Provider == b.Provider && a.Image == b.Image && a.Kind == b.Kind && a.Pool == b.Pool &&
		a.CreatedAt == b.CreatedAt && a.ExpiresAt == b.ExpiresAt && maps.Equal(a.Env, b.Env) && (a.Env == nil) == (b.Env == nil) &&
		a.Workdir == b.Workdir && a.Paused == b.Paused && a.Tenant == b.Tenant && a.Leased == b.Leased
}

func (s *store) load() ([]*Record, error) {
	b, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading state %s: %w", s.path, err)
	}
	var f stateFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("reading state %s: %w (move it aside to start afresh: the next roched finds the sandboxes it listed again from the sandboxes themselves, keeping clients' and removing the pool's)", s.path, err)
	}
	if f.Version != stateVersion {
		return nil, fmt.Errorf("state %s has version %d, this roched reads %d", s.path, f.Version, stateVersion)
	}
	return f.Sandboxes, nil
}

// readInstance returns the instance id a state file holds, or "" (no file, or one that
// load will report on).
func readInstance(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var f stateFile
	if json.Unmarshal(b, &f) != nil {
		return ""
	}
	return f.Instance
}

// saveThrough returns once a snapshot at least as new as seq is on disk. One write is
// under way at a time, of the state as it is when it begins (snapshot gives it and its
// sequence number); a change made while one is under way waits for it and, if that
// snapshot predates the change, for the next, which one of the changes waiting makes
// for all of them. Under a burst of changes, one write serves each group of them
// instead of every change writing the whole file, and no older state can follow a newer
// one onto the disk.
func (s *store) saveThrough(seq uint64, snapshot func() (uint64, []*Record)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.wrote == nil {
		s.wrote = sync.NewCond(&s.mu)
	}
	for s.written < seq {
		if s.writing {
			s.wrote.Wait()
			continue
		}
		s.writing = true
		s.mu.Unlock()
		cur, recs := snapshot()
		err := s.write(recs)
		s.mu.Lock()
		s.writing = false
		if err == nil {
			s.written = max(s.written, cur)
		}
		s.wrote.Broadcast()
		if err != nil {
			return err
		}
	}
	return nil
}

// encode is json.Marshal of the stateFile holding recs, reusing the JSON of the records
// that have not changed since the last write.
func (s *store) encode(recs []*Record) ([]byte, error) {
	head, err := json.Marshal(stateFile{Version: stateVersion, Instance: s.instance})
	if err != nil {
		return nil, err
	}
	// head ends in "sandboxes":null}: the records go in its place.
	head = bytes.TrimSuffix(head, []byte("null}"))
	if s.encoded == nil {
		s.encoded = map[string]*encodedRecord{}
	}
	s.gen++
	size := len(head) + 2
	parts := make([][]byte, len(recs))
	for i, r := range recs {
		e := s.encoded[r.ID]
		if e == nil || !sameSaved(&e.rec, r) {
			b, err := json.Marshal(r)
			if err != nil {
				return nil, err
			}
			e = &encodedRecord{rec: *r, b: b}
			e.rec.Env = maps.Clone(r.Env)
			s.encoded[r.ID] = e
		}
		e.gen = s.gen
		parts[i] = e.b
		size += len(e.b) + 1
	}
	if len(s.encoded) > len(recs) {
		maps.DeleteFunc(s.encoded, func(_ string, e *encodedRecord) bool { return e.gen != s.gen })
	}
	b := make([]byte, 0, size)
	b = append(b, head...)
	if recs == nil {
		return append(b, "null}"...), nil
	}
	b = append(b, '[')
	for i, p := range parts {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, p...)
	}
	return append(b, "]}"...), nil
}

// write replaces the state file with recs. The file is written whole beside it (its
// spare, see replaceFile) and swapped in at once, so that a daemon dying mid-write
// leaves the previous state intact.
func (s *store) write(recs []*Record) error {
	b, err := s.encode(recs)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(s.path), 0o700); err != nil {
		return fmt.Errorf("creating state directory: %w", err)
	}
	if err := replaceFile(s.path, b); err != nil {
		return fmt.Errorf("writing state %s: %w", s.path, err)
	}
	return nil
}
