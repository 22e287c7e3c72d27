package main

import (
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// These are unit tests of the plugin's logic, with shell scripts for delegates and a test
// server for the API server; internal/testcluster's tests run it for real in the cluster.

// fakeDelegate writes a delegate plugin that appends "NAME COMMAND" and its stdin to a log
// and prints a result naming itself, or fails when fail is set.
func fakeDelegate(t *testing.T, dir, name string, fail bool) {
	t.Helper()
	script := "#!/bin/sh\nin=$(cat)\necho \"" + name + " $CNI_COMMAND $in\" >> \"$FAKE_LOG\"\n"
	if fail {
		script += "echo '{\"cniVersion\":\"1.0.0\",\"code\":11,\"msg\":\"" + name + " broke\"}'\nexit 1\n"
	} else {
		script += "echo '{\"cniVersion\":\"1.0.0\",\"interfaces\":[{\"name\":\"" + name + "\"}]}'\n"
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
}

type env struct {
	conf string
	log  string
}

func setup(t *testing.T, labels map[string]map[string]string, failDelegate string) env {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		name := strings.TrimPrefix(r.URL.Path, "/api/v1/namespaces/ns/pods/")
		l, ok := labels[name]
		if !ok {
			http.Error(w, `{"kind":"Status","code":404}`, http.StatusNotFound)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"metadata": map[string]any{"labels": l}})
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), ca, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	fakeDelegate(t, bin, "first", failDelegate == "first")
	fakeDelegate(t, bin, "second", failDelegate == "second")
	t.Setenv("CNI_PATH", bin)
	t.Setenv("FAKE_LOG", filepath.Join(dir, "log"))
	t.Setenv("CNI_NETNS", "/var/run/netns/test")
	conf := map[string]any{
		"cniVersion": "1.0.0", "name": "roche-test", "type": "roche-test-cni",
		"apiServer": srv.URL, "tokenFile": filepath.Join(dir, "token"), "caFile": filepath.Join(dir, "ca.crt"),
		"offLabel": "roche.network", "offValue": "none",
		"runtimeConfig": map[string]any{"portMappings": []any{map[string]any{"hostPort": 8080}}},
		"delegates": []any{
			map[string]any{"type": "first"},
			map[string]any{"type": "second", "capabilities": map[string]any{"portMappings": true}},
		},
	}
	b, _ := json.Marshal(conf)
	return env{conf: string(b), log: filepath.Join(dir, "log")}
}

func readLog(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func TestAddNetworkOffIsLoopbackOnlyAndRunsNoDelegate(t *testing.T) {
	e := setup(t, map[string]map[string]string{"p": {"roche.network": "none"}}, "")
	t.Setenv("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p")
	out, err := run("ADD", strings.NewReader(e.conf))
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Interfaces []struct{ Name, Sandbox string }
		IPs        []struct{ Address string }
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.IPs) != 1 || res.IPs[0].Address != "127.0.0.1/8" || len(res.Interfaces) != 1 || res.Interfaces[0].Sandbox != "/var/run/netns/test" {
		t.Errorf("result %s, want the loopback address only", out)
	}
	if l := readLog(t, e.log); l != nil {
		t.Errorf("delegates ran for a network-off Pod: %q", l)
	}
}

func TestAddChainsDelegatesWithPrevResultAndPortMappings(t *testing.T) {
	e := setup(t, map[string]map[string]string{"p": {"app": "x"}}, "")
	t.Setenv("CNI_ARGS", "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p")
	out, err := run("ADD", strings.NewReader(e.conf))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `"second"`) {
		t.Errorf("result %s, want the last delegate's", out)
	}
	l := readLog(t, e.log)
	if len(l) != 2 || !strings.HasPrefix(l[0], "first ADD ") || !strings.HasPrefix(l[1], "second ADD ") {
		t.Fatalf("delegate calls %q, want first then second", l)
	}
	if strings.Contains(l[0], "prevResult") || strings.Contains(l[0], "portMappings") {
		t.Errorf("first delegate got %s, want no prevResult and no portMappings (it has no capability)", l[0])
	}
	if !strings.Contains(l[1], `"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"first"}]}`) || !strings.Contains(l[1], `"hostPort":8080`) {
		t.Errorf("second delegate got %s, want the first's result and the port mappings", l[1])
	}
}

func TestAddFailsClosedWhenThePodCannotBeRead(t *testing.T) {
	e := setup(t, nil, "")
	t.Setenv("CNI_ARGS", "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=gone")
	if _, err := run("ADD", strings.NewReader(e.conf)); err == nil {
		t.Fatal("ADD for a Pod the API server does not know succeeded")
	}
	t.Setenv("CNI_ARGS", "IgnoreUnknown=1")
	if _, err := run("ADD", strings.NewReader(e.conf)); err == nil {
		t.Fatal("ADD without a Pod in CNI_ARGS succeeded")
	}
	if l := readLog(t, e.log); l != nil {
		t.Errorf("delegates ran although the Pod's labels were unknown: %q", l)
	}
}

func TestDelRunsEveryDelegateInReverseEvenAfterAFailure(t *testing.T) {
	e := setup(t, nil, "second")
	t.Setenv("CNI_ARGS", "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=gone")
	_, err := run("DEL", strings.NewReader(e.conf))
	if err == nil || !strings.Contains(err.Error(), "second broke") {
		t.Errorf("DEL error = %v, want the failing delegate's", err)
	}
	l := readLog(t, e.log)
	if len(l) != 2 || !strings.HasPrefix(l[0], "second DEL ") || !strings.HasPrefix(l[1], "first DEL ") {
		t.Errorf("delegate calls %q, want second then first", l)
	}
}

func TestRefusesOtherVersionsAndPluginPaths(t *testing.T) {
	if _, err := run("ADD", strings.NewReader(`{"cniVersion":"0.4.0"}`)); err == nil {
		t.Error("cniVersion 0.4.0 accepted")
	}
	e := setup(t, map[string]map[string]string{"p": {}}, "")
	t.Setenv("CNI_ARGS", "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p")
	bad := strings.Replace(e.conf, `"type":"first"`, `"type":"../first"`, 1)
	if _, err := run("ADD", strings.NewReader(bad)); err == nil {
		t.Error("a delegate type with a path was run")
	}
}
