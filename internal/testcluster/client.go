package testcluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// Client speaks to the test cluster's API server as its admin, with the standard library.
type Client struct {
	cluster *Cluster
	token   string
	http    *http.Client
}

// APIError is an API server answer outside 2xx.
type APIError struct {
	Method, Path string
	Code         int
	Body         string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s %s: %d %s", e.Method, e.Path, e.Code, strings.TrimSpace(e.Body))
}

// IsNotFound reports whether err is the API server's 404.
func IsNotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Code == http.StatusNotFound
}

// Client returns an admin client for the cluster.
func (c *Cluster) Client(t testing.TB) *Client {
	t.Helper()
	cl, err := c.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// NewClient is Client for code without a testing.TB.
func (c *Cluster) NewClient() (*Client, error) {
	token, err := os.ReadFile(c.TokenFile)
	if err != nil {
		return nil, fmt.Errorf("reading the test cluster's admin token: %w", err)
	}
	caPEM, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, fmt.Errorf("reading the test cluster's CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("no certificate in %s", c.CAFile)
	}
	return &Client{
		cluster: c,
		token:   strings.TrimSpace(string(token)),
		http: &http.Client{
			Timeout:   30 * time.Second,
			Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
		},
	}, nil
}

// Close lets go of the client's idle connections (tests that check for leaked goroutines
// call it before they end).
func (cl *Client) Close() { cl.http.CloseIdleConnections() }

// Do sends in (JSON-encoded unless nil) to path and decodes the answer into out unless out
// is nil.
func (cl *Client) Do(ctx context.Context, method, path string, in, out any) error {
	b, err := cl.Raw(ctx, method, path, in)
	if err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("decoding the answer to %s %s: %w", method, path, err)
	}
	return nil
}

// Raw is Do returning the answer's body as it is (Pod logs, for one).
func (cl *Client) Raw(ctx context.Context, method, path string, in any) ([]byte, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, cl.cluster.Server+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+cl.token)
	req.Header.Set("Accept", "application/json, */*")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := cl.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("reading the answer to %s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return nil, &APIError{Method: method, Path: path, Code: resp.StatusCode, Body: string(b)}
	}
	return b, nil
}

// Namespace creates a namespace named prefix-RANDOM and deletes it when the test ends,
// waiting (up to two minutes) until it and everything in it are gone.
func (cl *Client) Namespace(t testing.TB, prefix string) string {
	t.Helper()
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	name := prefix + "-" + hex.EncodeToString(rnd[:])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": name}}
	if err := cl.Do(ctx, http.MethodPost, "/api/v1/namespaces", ns, nil); err != nil {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := cl.DeleteNamespace(ctx, name); err != nil {
			t.Errorf("deleting namespace %s: %v", name, err)
		}
	})
	// The ServiceAccount admission plugin refuses Pods until the controller-manager has
	// made the namespace's default ServiceAccount, a second or so after the namespace.
	for {
		err := cl.Do(ctx, http.MethodGet, "/api/v1/namespaces/"+name+"/serviceaccounts/default", nil, nil)
		if err == nil {
			return name
		}
		select {
		case <-ctx.Done():
			t.Fatalf("namespace %s has no default ServiceAccount after 30 s: %v", name, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// DeleteNamespace deletes a namespace and waits until it is gone.
func (cl *Client) DeleteNamespace(ctx context.Context, name string) error {
	path := "/api/v1/namespaces/" + name
	if err := cl.Do(ctx, http.MethodDelete, path, nil, nil); err != nil && !IsNotFound(err) {
		return err
	}
	for {
		err := cl.Do(ctx, http.MethodGet, path, nil, nil)
		if IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("namespace %s still there: %w", name, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Pod is the part of a Pod the tests here read.
type Pod struct {
	Metadata struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		NodeName string `json:"nodeName"`
	} `json:"spec"`
	Status struct {
		Phase  string `json:"phase"`
		PodIP  string `json:"podIP"`
		Reason string `json:"reason"`
	} `json:"status"`
}

// WaitPod polls a Pod until its phase is one of phases, and fails with the phase it had
// when ctx ends.
func (cl *Client) WaitPod(ctx context.Context, namespace, name string, phases ...string) (*Pod, error) {
	path := "/api/v1/namespaces/" + namespace + "/pods/" + name
	var pod Pod
	for {
		err := cl.Do(ctx, http.MethodGet, path, nil, &pod)
		if err == nil {
			for _, p := range phases {
				if pod.Status.Phase == p {
					return &pod, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return &pod, fmt.Errorf("pod %s/%s is %q, not %v: %w (last error: %v)", namespace, name, pod.Status.Phase, phases, ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
