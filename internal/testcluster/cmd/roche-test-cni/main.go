// Command roche-test-cni is the test cluster's CNI plugin. It gives a Pod labelled
// roche.network=none a network namespace with only its loopback interface, and hands every
// other Pod to the delegate plugins it is configured with (bridge with host-local IPAM, then
// portmap), returning their result.
//
// The bridge plugin cannot leave one Pod off the network, and the test cluster's bridge does
// not enforce NetworkPolicy, so without this plugin a "network off" test would pass on a
// Pod that can still reach the node. A real cluster gets the same effect from a CNI that
// enforces NetworkPolicy; this plugin exists only so the test is real here.
//
// It is the only plugin of its network list; containerd runs it with the usual CNI_*
// environment and the network configuration on stdin:
//
//	{"cniVersion": "1.0.0", "name": "roche-test", "type": "roche-test-cni",
//	 "capabilities": {"portMappings": true},
//	 "apiServer": "https://10.0.0.1:6443", "tokenFile": "...", "caFile": "...",
//	 "offLabel": "roche.network", "offValue": "none",
//	 "delegates": [{"type": "bridge", ...}, {"type": "portmap", ...}]}
//
// ADD reads the Pod (K8S_POD_NAMESPACE and K8S_POD_NAME in CNI_ARGS) from the API server and
// fails closed: a Pod it cannot read gets no network at all rather than a guessed one. DEL
// always runs the delegates' DEL, which is idempotent, so a Pod's address and veth are
// released whatever its labels were.
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

const cniVersion = "1.0.0"

// netConf is the plugin's own configuration; the delegates' configurations are passed on
// as they are.
type netConf struct {
	CNIVersion    string                     `json:"cniVersion"`
	Name          string                     `json:"name"`
	APIServer     string                     `json:"apiServer"`
	TokenFile     string                     `json:"tokenFile"`
	CAFile        string                     `json:"caFile"`
	OffLabel      string                     `json:"offLabel"`
	OffValue      string                     `json:"offValue"`
	Delegates     []map[string]any           `json:"delegates"`
	RuntimeConfig map[string]json.RawMessage `json:"runtimeConfig,omitempty"`
	PrevResult    json.RawMessage            `json:"prevResult,omitempty"`
}

// cniError is the error object the CNI specification asks for on stdout.
type cniError struct {
	CNIVersion string `json:"cniVersion"`
	Code       int    `json:"code"`
	Msg        string `json:"msg"`
	Details    string `json:"details,omitempty"`
}

func (e *cniError) Error() string { return e.Msg + ": " + e.Details }

// Error codes from the CNI specification.
const (
	codeIncompatibleVersion = 1
	codeInvalidConfig       = 7
	codeTryLater            = 11
	codeInternal            = 999
)

func main() {
	out, err := run(os.Getenv("CNI_COMMAND"), os.Stdin)
	if err != nil {
		var ce *cniError
		if !errors.As(err, &ce) {
			ce = &cniError{Code: codeInternal, Msg: "roche-test-cni", Details: err.Error()}
		}
		ce.CNIVersion = cniVersion
		_ = json.NewEncoder(os.Stdout).Encode(ce)
		os.Exit(1)
	}
	if out != nil {
		_, _ = os.Stdout.Write(out)
	}
}

func run(command string, stdin io.Reader) ([]byte, error) {
	if command == "VERSION" {
		return []byte(`{"cniVersion":"1.0.0","supportedVersions":["1.0.0"]}`), nil
	}
	raw, err := io.ReadAll(stdin)
	if err != nil {
		return nil, fmt.Errorf("reading the network configuration: %w", err)
	}
	var conf netConf
	if err := json.Unmarshal(raw, &conf); err != nil {
		return nil, &cniError{Code: codeInvalidConfig, Msg: "parsing the network configuration", Details: err.Error()}
	}
	if conf.CNIVersion != cniVersion {
		return nil, &cniError{Code: codeIncompatibleVersion, Msg: "unsupported cniVersion", Details: fmt.Sprintf("%q (this plugin speaks %s)", conf.CNIVersion, cniVersion)}
	}
	switch command {
	case "ADD":
		off, err := networkOff(conf, os.Getenv("CNI_ARGS"))
		if err != nil {
			return nil, err
		}
		if off {
			return loopbackOnly(os.Getenv("CNI_NETNS"))
		}
		return delegate(conf, "ADD", false)
	case "DEL":
		return delegate(conf, "DEL", true)
	case "CHECK":
		off, err := networkOff(conf, os.Getenv("CNI_ARGS"))
		if err != nil {
			return nil, err
		}
		if off {
			return nil, nil
		}
		return delegate(conf, "CHECK", false)
	default:
		return nil, &cniError{Code: codeInvalidConfig, Msg: "unknown CNI_COMMAND", Details: command}
	}
}

// podArgs returns the Pod's namespace and name from CNI_ARGS
// ("IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=name;...").
func podArgs(cniArgs string) (namespace, name string) {
	for _, kv := range strings.Split(cniArgs, ";") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "K8S_POD_NAMESPACE":
			namespace = v
		case "K8S_POD_NAME":
			name = v
		}
	}
	return namespace, name
}

// networkOff reports whether the Pod named in CNI_ARGS carries the "network off" label.
func networkOff(conf netConf, cniArgs string) (bool, error) {
	ns, name := podArgs(cniArgs)
	if ns == "" || name == "" {
		return false, &cniError{Code: codeInvalidConfig, Msg: "no Pod in CNI_ARGS", Details: "K8S_POD_NAMESPACE and K8S_POD_NAME are needed to read the Pod's labels"}
	}
	labels, err := podLabels(conf, ns, name)
	if err != nil {
		return false, &cniError{Code: codeTryLater, Msg: "reading Pod " + ns + "/" + name, Details: err.Error()}
	}
	return labels[conf.OffLabel] == conf.OffValue, nil
}

func podLabels(conf netConf, ns, name string) (map[string]string, error) {
	token, err := os.ReadFile(conf.TokenFile)
	if err != nil {
		return nil, fmt.Errorf("reading the API token: %w", err)
	}
	caPEM, err := os.ReadFile(conf.CAFile)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("no certificate in %s", conf.CAFile)
	}
	client := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
	}
	u := strings.TrimSuffix(conf.APIServer, "/") + "/api/v1/namespaces/" + url.PathEscape(ns) + "/pods/" + url.PathEscape(name)
	var lastErr error
	// A few tries: the API server may be busy right after the cluster starts.
	for attempt := 0; attempt < 5; attempt++ {
		if attempt > 0 {
			time.Sleep(time.Duration(attempt) * 200 * time.Millisecond)
		}
		req, err := http.NewRequest(http.MethodGet, u, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
		resp, err := client.Do(req)
		if err != nil {
			lastErr = err
			continue
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
		_ = resp.Body.Close()
		if err != nil {
			lastErr = err
			continue
		}
		if resp.StatusCode != http.StatusOK {
			lastErr = fmt.Errorf("GET %s: %s: %s", u, resp.Status, bytes.TrimSpace(body))
			if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
				continue
			}
			return nil, lastErr
		}
		var pod struct {
			Metadata struct {
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(body, &pod); err != nil {
			return nil, fmt.Errorf("decoding Pod %s/%s: %w", ns, name, err)
		}
		return pod.Metadata.Labels, nil
	}
	return nil, lastErr
}

// loopbackOnly is the result for a Pod without network: nothing is created in its network
// namespace, where the runtime's loopback plugin has already brought up lo. containerd
// insists on an address for the Pod's eth0 in the result (it records it as the Pod IP), so
// the result reports the loopback address under that name; no eth0 exists in the Pod.
func loopbackOnly(netns string) ([]byte, error) {
	res := map[string]any{
		"cniVersion": cniVersion,
		"interfaces": []map[string]any{{"name": "eth0", "sandbox": netns}},
		"ips":        []map[string]any{{"address": "127.0.0.1/8", "interface": 0}},
	}
	return json.Marshal(res)
}

// delegate runs the delegate plugins in order for ADD and CHECK, each given the previous
// one's result, and in reverse order for DEL, where every delegate runs even if one fails.
func delegate(conf netConf, command string, reverse bool) ([]byte, error) {
	if len(conf.Delegates) == 0 {
		return nil, &cniError{Code: codeInvalidConfig, Msg: "no delegates configured"}
	}
	order := make([]map[string]any, len(conf.Delegates))
	copy(order, conf.Delegates)
	if reverse {
		for i, j := 0, len(order)-1; i < j; i, j = i+1, j-1 {
			order[i], order[j] = order[j], order[i]
		}
	}
	prev := conf.PrevResult
	var firstErr error
	for _, d := range order {
		out, err := runDelegate(conf, d, command, prev)
		if err != nil {
			if command != "DEL" {
				return nil, err
			}
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		if command == "ADD" {
			prev = out
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	if command == "ADD" {
		return prev, nil
	}
	return nil, nil
}

func runDelegate(conf netConf, d map[string]any, command string, prev json.RawMessage) ([]byte, error) {
	typ, _ := d["type"].(string)
	if typ == "" || strings.ContainsAny(typ, `/\`) {
		return nil, &cniError{Code: codeInvalidConfig, Msg: "delegate without a plain type", Details: fmt.Sprint(d["type"])}
	}
	sub := make(map[string]any, len(d)+4)
	for k, v := range d {
		sub[k] = v
	}
	sub["cniVersion"] = conf.CNIVersion
	sub["name"] = conf.Name
	// The runtime filled runtimeConfig for this plugin's capabilities; a delegate gets the
	// entries for the capabilities it declares.
	if caps, ok := d["capabilities"].(map[string]any); ok && len(conf.RuntimeConfig) > 0 {
		rc := map[string]json.RawMessage{}
		for c, on := range caps {
			if b, _ := on.(bool); b {
				if v, ok := conf.RuntimeConfig[c]; ok {
					rc[c] = v
				}
			}
		}
		if len(rc) > 0 {
			sub["runtimeConfig"] = rc
		}
	}
	if len(prev) > 0 {
		sub["prevResult"] = prev
	}
	stdin, err := json.Marshal(sub)
	if err != nil {
		return nil, err
	}
	bin, err := findPlugin(typ, os.Getenv("CNI_PATH"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin)
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.Env = append(os.Environ(), "CNI_COMMAND="+command)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		var ce cniError
		if json.Unmarshal(stdout.Bytes(), &ce) == nil && ce.Msg != "" {
			ce.Msg = typ + ": " + ce.Msg
			return nil, &ce
		}
		return nil, fmt.Errorf("running delegate %s %s: %w: %s", typ, command, err, bytes.TrimSpace(stdout.Bytes()))
	}
	return bytes.TrimSpace(stdout.Bytes()), nil
}

func findPlugin(typ, cniPath string) (string, error) {
	for _, dir := range filepath.SplitList(cniPath) {
		p := filepath.Join(dir, typ)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", &cniError{Code: codeInvalidConfig, Msg: "delegate plugin not found", Details: fmt.Sprintf("%s in CNI_PATH %q", typ, cniPath)}
}
