package ledger

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
)

// TestSaveThroughGroupsChanges: changes saved at once from many goroutines each return
// with their change on disk, the file ends with the last state, and the first write,
// begun after all of them were made, serves them all.
func TestSaveThroughGroupsChanges(t *testing.T) {
	s := &store{path: filepath.Join(t.TempDir(), "state.json"), instance: "test"}
	var mu sync.Mutex
	var seq uint64
	records := map[string]*Record{}
	var writes atomic.Int32
	snapshot := func() (uint64, []*Record) {
		writes.Add(1)
		mu.Lock()
		defer mu.Unlock()
		recs := make([]*Record, 0, len(records))
		for _, r := range records {
			c := *r
			recs = append(recs, &c)
		}
		return seq, recs
	}
	onDisk := func() map[string]bool {
		b, err := os.ReadFile(s.path)
		if err != nil {
			t.Error(err)
			return nil
		}
		var f stateFile
		if err := json.Unmarshal(b, &f); err != nil {
			t.Error(err)
		}
		ids := map[string]bool{}
		for _, r := range f.Sandboxes {
			ids[r.ID] = true
		}
		return ids
	}
	const n = 64
	var made, wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		made.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("sb-%d", i)
			mu.Lock()
			records[id] = &Record{ID: id}
			seq++
			mine := seq
			mu.Unlock()
			made.Done()
			<-start
			if err := s.saveThrough(mine, snapshot); err != nil {
				t.Error(err)
				return
			}
			// Its change is on disk when it returns (later ones may be too).
			if !onDisk()[id] {
				t.Errorf("%s returned before its change was written", id)
			}
		}()
	}
	made.Wait()
	close(start)
	wg.Wait()
	if got := onDisk(); len(got) != n {
		t.Errorf("the file holds %d sandboxes, want all %d", len(got), n)
	}
	if w := writes.Load(); w != 1 {
		t.Errorf("%d writes for %d changes made before any began, want 1", w, n)
	}
}
