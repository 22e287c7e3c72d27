package wasm

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest/codectx"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestWarmCode: the instance WarmCode starts goes to the sandbox's default context at
// its first cell, which runs fresh in it (count 1, nothing defined); a context started
// with other env gets its own and leaves the spare; destroying the sandbox ends a spare
// nobody took. (The conformance suite checks the hand-over by pids, which python.wasm
// does not have; here it is checked by identity.)
func TestWarmCode(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newSandbox(t, nil)
	spare := warmed(t, id)

	other, err := tp.CreateContext(ctxFor(t, time.Minute), id, roche.ContextOptions{Env: map[string]string{"OTHER": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if k := codeSet(t, id).Kernel(other.ID); k == nil || k == spare {
		t.Fatal("a context started with other env took the spare")
	}

	ex, err := tp.RunCode(ctxFor(t, time.Minute), id, roche.CodeRequest{Code: "'x' in globals()"})
	if err != nil || ex.Error != nil || ex.Text() != "False" || ex.ExecutionCount != 1 {
		t.Fatalf("first cell: %+v %v", ex, err)
	}
	if k := codeSet(t, id).Kernel(ex.Context); k == nil || k != spare {
		t.Fatal("the default context did not take the spare")
	}

	// A spare nobody takes ends with its sandbox.
	id2 := newSandbox(t, nil)
	spare2 := warmed(t, id2)
	if err := tp.Destroy(context.Background(), id2); err != nil {
		t.Fatal(err)
	}
	select {
	case <-spare2.Ended():
	case <-time.After(10 * time.Second):
		t.Fatal("the spare instance outlived its sandbox")
	}
	tp.codeMu.Lock()
	_, kept := tp.codeSets[id2]
	tp.codeMu.Unlock()
	if kept {
		t.Fatal("the destroyed sandbox's spare is still listed")
	}
	if err := tp.WarmCode(ctxFor(t, time.Minute), id, "bash"); err == nil || !strings.Contains(err.Error(), "bash") {
		t.Fatalf("warming bash: %v", err)
	}
}

// warmed warms sandbox id's python and returns the spare instance it keeps.
func warmed(t *testing.T, id string) *codectx.Kernel {
	t.Helper()
	if err := tp.WarmCode(ctxFor(t, time.Minute), id, "python"); err != nil {
		t.Fatal(err)
	}
	spare := codeSet(t, id).Spare()
	if spare == nil {
		t.Fatal("no spare instance after WarmCode")
	}
	return spare
}

// codeSet returns sandbox id's code contexts.
func codeSet(t *testing.T, id string) *codectx.Set {
	t.Helper()
	tp.codeMu.Lock()
	defer tp.codeMu.Unlock()
	s := tp.codeSets[id]
	if s == nil {
		t.Fatalf("no code contexts for sandbox %s", id)
	}
	return s
}
