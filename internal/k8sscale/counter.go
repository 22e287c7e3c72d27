package k8sscale

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Counts are requests to the API server by "VERB resource": "create pods", "list
// pods", "get pods", "patch networkpolicies", "delete pods" and so on.
type Counts map[string]int

// Total is the number of requests.
func (c Counts) Total() int {
	n := 0
	for _, v := range c {
		n += v
	}
	return n
}

// Sub is c less an earlier count of the same process.
func (c Counts) Sub(before Counts) Counts {
	out := Counts{}
	for k, v := range c {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// Add adds other to c.
func (c Counts) Add(other Counts) {
	for k, v := range other {
		c[k] += v
	}
}

// String lists the counts, most first: "get pods 812, create pods 200, ...".
func (c Counts) String() string {
	keys := slices.Collect(maps.Keys(c))
	slices.SortFunc(keys, func(a, b string) int {
		if c[a] != c[b] {
			return c[b] - c[a]
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, c[k])
	}
	return strings.Join(parts, ", ")
}

// counter counts the requests that pass through the transports it wraps, and times
// each: from handing it to the transport to its response's headers, which is the API
// server's time and the wire's, not the client's rate limiter's (that waits before).
type counter struct {
	mu   sync.Mutex
	n    Counts
	took map[string][]time.Duration
	// gzipped counts the answers that came compressed (and were inflated by the
	// transport): none should, roched asks for them plain.
	gzipped int
}

func newCounter() *counter { return &counter{n: Counts{}, took: map[string][]time.Duration{}} }

// wrap is a rest.Config transport wrapper (kubernetes.WithTransportWrapper).
func (c *counter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		key := requestKey(req.Method, req.URL.Path, req.URL.Query().Get("watch") == "true")
		c.mu.Lock()
		c.n[key]++
		c.mu.Unlock()
		start := time.Now()
		resp, err := rt.RoundTrip(req)
		took := time.Since(start)
		c.mu.Lock()
		c.took[key] = append(c.took[key], took)
		if resp != nil && resp.Uncompressed {
			c.gzipped++
		}
		c.mu.Unlock()
		return resp, err
	})
}

// serveGzipped answers with how many answers came gzipped.
func (c *counter) serveGzipped(w http.ResponseWriter, _ *http.Request) {
	c.mu.Lock()
	n := c.gzipped
	c.mu.Unlock()
	json.NewEncoder(w).Encode(n)
}

// serveTimings answers with the round trips of the requests named by ?key= ("patch
// pods"), from the ?from=th on, in nanoseconds, as JSON.
func (c *counter) serveTimings(w http.ResponseWriter, req *http.Request) {
	from, _ := strconv.Atoi(req.URL.Query().Get("from"))
	c.mu.Lock()
	all := c.took[req.URL.Query().Get("key")]
	out := make([]int64, 0, max(0, len(all)-from))
	for _, d := range all[min(from, len(all)):] {
		out = append(out, int64(d))
	}
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

// ServeHTTP answers with the counts as JSON.
func (c *counter) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	c.mu.Lock()
	b, err := json.Marshal(c.n)
	c.mu.Unlock()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// requestKey names a request as the API server's audit log would: its verb (a GET of a
// collection is "list", with watch=true "watch") and its resource, with a subresource
// after a slash ("create pods/exec").
func requestKey(method, path string, watch bool) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	// /api/v1/... or /apis/GROUP/VERSION/...
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return strings.ToLower(method) + " " + path
	}
	if len(parts) >= 2 && parts[0] == "namespaces" && len(parts) != 2 {
		parts = parts[2:] // namespaces/NS/RESOURCE/...; namespaces/NS alone is a namespace
	}
	resource, named, sub := "", false, ""
	switch len(parts) {
	case 0:
		return strings.ToLower(method) + " /"
	case 1:
		resource = parts[0]
	case 2:
		resource, named = parts[0], true
	default:
		resource, named, sub = parts[0], true, parts[2]
	}
	if sub != "" {
		resource += "/" + sub
	}
	verb := map[string]string{
		http.MethodPost: "create", http.MethodPut: "update", http.MethodPatch: "patch",
		http.MethodDelete: "delete", http.MethodGet: "get",
	}[method]
	switch {
	case verb == "":
		verb = strings.ToLower(method)
	case method == http.MethodGet && watch:
		verb = "watch"
	case method == http.MethodGet && !named:
		verb = "list"
	case method == http.MethodDelete && !named:
		verb = "deletecollection"
	}
	return verb + " " + resource
}
