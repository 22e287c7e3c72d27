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
	mux.HandleFunc("/_ping", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("API-Version", "1.41")
		w.Write([]byte("OK"))
	})
	mux.HandleFunc("/v1.41/containers/json", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(listed)
	})
	mux.HandleFunc("/v1.41/containers/{id}/json", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		mu.Lock()
		inspected = append(inspected, id)
		mu.Unlock()
		if id == "ghost" {
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(map[string]string{"message": "No such container: ghost"})
			return
		}
		json.NewEncoder(w).Encode(container.InspectResponse{ContainerJSONBase: &container.ContainerJSONBase{
			ID: id, State: &container.State{Status: container.StateDead, Dead: true},
		}})
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
	defer p.Close()
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
