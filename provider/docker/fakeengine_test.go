package docker_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"

	"github.com/roche-sandbox/roche/provider/docker"
)

// TestListLeavesOutGhosts: of the containers the engine lists as dead, the one it cannot
// inspect (a ghost a restarted 20.10 engine leaves, moby/moby#51692) is left out; the one
// it can is listed, for roche gc to remove. The engine here is a fake answering the three
// calls List makes: a ghost cannot be made on demand (TestDockerdRestartedUnderRoched
// checks a real one when its restart leaves one).
func TestListLeavesOutGhosts(t *testing.T) {
	labels := map[string]string{docker.LabelManaged: "true", docker.LabelProvider: "docker"}
	listed := []container.Summary{
		{ID: "ghost", State: container.StateDead, Labels: labels},
		{ID: "dead", State: container.StateDead, Labels: labels},
		{ID: "exited", State: container.StateExited, Labels: labels},
	}
	var (
		mu        sync.Mutex
		inspected []string
	)
	mux := http.NewServeMux()
	mux.HandleFunc("/v1.41/containers/json", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(listed)
	})
	mux.HandleFunc("/v1.41/containers/{id}/json", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		mu.Lock()
		inspected = append(inspected, id)
		mu.Unlock()
		if id == "ghost" {
			engineError(w, http.StatusNotFound, "No such container: ghost")
			return
		}
		json.NewEncoder(w).Encode(container.InspectResponse{ContainerJSONBase: &container.ContainerJSONBase{
			ID: id, State: &container.State{Status: container.StateDead, Dead: true},
		}})
	})
	p := fakeEngine(t, mux)
	list, err := p.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, sb := range list {
		got = append(got, sb.ID)
	}
	if strings.Join(got, " ") != "dead exited" {
		t.Errorf("listed %v, want [dead exited]: the ghost left out, the others kept", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(inspected, " ") != "ghost dead" {
		t.Errorf("inspected %v, want [ghost dead]: only the dead ones", inspected)
	}
}

// TestDestroyRemovesAgainWhatTheEnginesRemovalLeft: a destroy that finds the engine
// already removing the sandbox waits, and when the engine's removal ends leaving the
// container "dead" (it failed), removes it again rather than taking it for done. A real
// engine's removal cannot be made to fail on demand, so the engine is a fake answering
// what Destroy asks: TestDestroyWaitsForTheEnginesRemoval checks the wait on a real one.
func TestDestroyRemovesAgainWhatTheEnginesRemovalLeft(t *testing.T) {
	var (
		mu      sync.Mutex
		calls   []string // what the fake was asked and in which state it answered
		state   = container.StateExited
		polls   int
		removed bool
	)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1.41/containers/x/json", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if removed {
			engineError(w, http.StatusNotFound, "No such container: x")
			return
		}
		if state == container.StateRemoving {
			// The engine's removal runs for three polls, then fails.
			if polls++; polls > 3 {
				state = container.StateDead
			}
		}
		calls = append(calls, "inspect "+string(state))
		json.NewEncoder(w).Encode(container.InspectResponse{
			ContainerJSONBase: &container.ContainerJSONBase{ID: "x", State: &container.State{Status: state, Dead: state == container.StateDead}},
			Config:            &container.Config{Labels: map[string]string{docker.LabelManaged: "true", docker.LabelProvider: "docker"}},
		})
	})
	mux.HandleFunc("DELETE /v1.41/containers/x", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, "remove "+string(state))
		if state != container.StateDead {
			// The first remove finds the engine's own (auto-remove) under way.
			state = container.StateRemoving
			engineError(w, http.StatusConflict, "removal of container x is already in progress")
			return
		}
		removed = true
		w.WriteHeader(http.StatusNoContent)
	})
	p := fakeEngine(t, mux)
	if err := p.Destroy(context.Background(), "x"); err != nil {
		t.Fatalf("destroy: %v, want nil once the container is removed", err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := "inspect exited, remove exited, inspect removing, inspect removing, inspect removing, inspect dead, remove dead"
	if got := strings.Join(calls, ", "); got != want || !removed {
		t.Errorf("the engine was asked: %s (removed %v)\nwant: %s (removed)", got, removed, want)
	}
}

// fakeEngine is a Docker provider of an Engine API that mux answers (API 1.41, as
// Debian's 20.10), served on a unix socket until the test ends.
func fakeEngine(t *testing.T, mux *http.ServeMux) *docker.Provider {
	t.Helper()
	mux.HandleFunc("/_ping", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("API-Version", "1.41")
		w.Write([]byte("OK"))
	})
	sock := filepath.Join(t.TempDir(), "engine.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	dc, err := client.NewClientWithOpts(client.WithHost("unix://"+sock), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	p, err := docker.New(docker.WithClient(dc))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// engineError answers as the engine does when it refuses a call.
func engineError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]string{"message": msg})
}
