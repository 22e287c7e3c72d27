package ledger

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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

// TestSameSavedCoversEveryField: a change to any field the state file holds makes a
// record save differently, so a write never reuses the JSON of a record as it was.
func TestSameSavedCoversEveryField(t *testing.T) {
	base := Record{ID: "a", Provider: "p", Image: "i", Kind: KindClient, Pool: "k", CreatedAt: time.Unix(1, 0), ExpiresAt: time.Unix(2, 0),
		Env: map[string]string{"A": "1"}, Workdir: "/w", Tenant: "t"}
	rt := reflect.TypeOf(base)
	for i := range rt.NumField() {
		f := rt.Field(i)
		if !f.IsExported() {
			continue
		}
		changed := base
		changed.Env = maps.Clone(base.Env)
		v := reflect.ValueOf(&changed).Elem().Field(i)
		switch v.Kind() {
		case reflect.String:
			v.SetString(v.String() + "x")
		case reflect.Bool:
			v.SetBool(!v.Bool())
		case reflect.Map:
			changed.Env["A"] = "2"
		case reflect.Struct:
			v.Set(reflect.ValueOf(time.Unix(3, 0)))
		default:
			t.Fatalf("field %s of kind %v: teach this test to change it", f.Name, v.Kind())
		}
		if sameSaved(&base, &changed) {
			t.Errorf("sameSaved misses a change of field %s", f.Name)
		}
	}
	if !sameSaved(&base, &base) {
		t.Error("a record is not the same as itself")
	}
}

// TestEncodeReusesOnlyUnchanged: the state file written with the JSON of unchanged
// records reused is what json.Marshal gives, after records change, come and go.
func TestEncodeReusesOnlyUnchanged(t *testing.T) {
	s := &store{instance: "inst"}
	recs := []*Record{
		{ID: "a", Kind: KindPooled, CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)},
		{ID: "b", Kind: KindClient, Env: map[string]string{"K": "v"}, Tenant: "t"},
	}
	check := func(recs []*Record) {
		t.Helper()
		got, err := s.encode(recs)
		if err != nil {
			t.Fatal(err)
		}
		want, err := json.Marshal(stateFile{Version: stateVersion, Instance: "inst", Sandboxes: recs})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("encoded\n%s\nwant\n%s", got, want)
		}
	}
	check(recs)
	// Changed in place, as the ledger's records are, then snapshotted again.
	recs[0].Kind, recs[0].Tenant = KindClient, "t"
	recs[1].Env["K"] = "w"
	recs = append(recs, &Record{ID: "c", Leased: true})
	check(recs)
	check(recs[1:])
	check(nil)
}
