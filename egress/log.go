package egress

import (
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultLogSize is how many decisions a proxy keeps (the newest); older ones are
// dropped and counted, so that a sandbox looping on refused requests costs the host a
// bounded amount of memory.
const DefaultLogSize = 1000

// Decision is one entry of a proxy's decision log: a connection (a CONNECT tunnel or a
// plain HTTP request) the sandbox asked for, and what the proxy did with it.
type Decision struct {
	// Seq numbers a proxy's decisions from 1, in the order they were made.
	Seq     uint64    `json:"seq"`
	Time    time.Time `json:"time"`
	Sandbox string    `json:"sandbox"`
	Tenant  string    `json:"tenant,omitempty"` // filled in by roched
	Host    string    `json:"host"`             // as the sandbox named it, lower case
	Port    int       `json:"port"`             // 0 when the request named none the proxy could read
	Addr    string    `json:"addr,omitempty"`   // the address resolved (and dialled when allowed)
	Method  string    `json:"method"`           // CONNECT, or the plain HTTP request's method
	Path    string    `json:"path,omitempty"`   // a plain HTTP request's path
	// Rule is the allowlist entry that allowed it, or, for a refusal that an entry could
	// fix, the entry that would have (see Suggest).
	Rule    string `json:"rule,omitempty"`
	Allowed bool   `json:"allowed"`
	// Reason says why, in the words the sandbox was told.
	Reason string `json:"reason"`
	// BytesOut and BytesIn are the bytes relayed to and from the upstream, filled in
	// when an allowed connection ends (Done).
	BytesOut int64 `json:"bytes_out"`
	BytesIn  int64 `json:"bytes_in"`
	// Done is false while an allowed connection is still open.
	Done bool `json:"done"`
}

// Target is host:port as a rule spells it.
func (d Decision) Target() string {
	if d.Port == 0 {
		return d.Host
	}
	return net.JoinHostPort(d.Host, strconv.Itoa(d.Port))
}

// decisionLog is a proxy's bounded log, a ring of the newest decisions.
type decisionLog struct {
	mu      sync.Mutex
	size    int
	ring    []*Decision
	next    uint64 // Seq of the next decision
	dropped uint64
}

func (l *decisionLog) add(d *Decision) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.next++
	d.Seq = l.next
	if len(l.ring) >= l.size {
		copy(l.ring, l.ring[1:])
		l.ring = l.ring[:len(l.ring)-1]
		l.dropped++
	}
	l.ring = append(l.ring, d)
}

// update runs f on a logged decision under the log's lock.
func (l *decisionLog) update(d *Decision, f func(*Decision)) Decision {
	l.mu.Lock()
	defer l.mu.Unlock()
	f(d)
	return *d
}

// since returns copies of the kept decisions with Seq > after, and how many decisions
// were dropped from the log over its life.
func (l *decisionLog) since(after uint64) ([]Decision, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Decision
	for _, d := range l.ring {
		if d.Seq > after {
			out = append(out, *d)
		}
	}
	return out, l.dropped
}

// Log returns the decisions this proxy keeps whose Seq is above after (0: all of them),
// oldest first, and how many older ones the bound dropped.
func (p *Proxy) Log(after uint64) ([]Decision, uint64) { return p.dlog.since(after) }

// Suggest returns the minimal allowlist entries that would have allowed every refusal
// in ds that an entry could allow: those a refusal names in Rule (one for want of an
// entry; not one refused for its address, its Host header or a cap), each once, in the
// order first needed.
func Suggest(ds []Decision) []string {
	var out []string
	seen := map[string]bool{}
	for _, d := range ds {
		// A refused request inside an intercepted connection names the entry that would
		// have allowed it ("POST https://host/path"), which holds a space and is not one
		// word a shell passes on: it is left to be added by hand.
		if d.Allowed || d.Rule == "" || strings.Contains(d.Rule, " ") {
			continue
		}
		if !seen[d.Rule] {
			seen[d.Rule] = true
			out = append(out, d.Rule)
		}
	}
	return out
}

// observers are told of every decision of every proxy in this process, once final (a
// refusal at once, an allowed connection when it ends, with its bytes).
var observers struct {
	mu   sync.Mutex
	next int
	fns  map[int]func(Decision)
}

// Observe calls fn with every final decision of every proxy in this process (roched
// counts them and writes them to its audit log) until the returned func is called. fn
// must not block.
func Observe(fn func(Decision)) (stop func()) {
	observers.mu.Lock()
	defer observers.mu.Unlock()
	if observers.fns == nil {
		observers.fns = map[int]func(Decision){}
	}
	id := observers.next
	observers.next++
	observers.fns[id] = fn
	return func() {
		observers.mu.Lock()
		delete(observers.fns, id)
		observers.mu.Unlock()
	}
}

func notify(d Decision) {
	observers.mu.Lock()
	fns := make([]func(Decision), 0, len(observers.fns))
	for _, fn := range observers.fns {
		fns = append(fns, fn)
	}
	observers.mu.Unlock()
	for _, fn := range fns {
		fn(d)
	}
}

// registry finds the proxy of a sandbox by its id, for roched's API: providers make and
// close the proxies, roched reads their logs and changes their policies.
var registry struct {
	mu    sync.Mutex
	byID  map[string]*Proxy
	hooks []*registerHook
}

// Lookup returns the proxy this process runs for sandbox id, or nil.
func Lookup(id string) *Proxy {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	return registry.byID[id]
}

// SetSandbox names the sandbox this proxy serves (its id, in the log and for Lookup),
// for a provider that learns the id after making the proxy.
func (p *Proxy) SetSandbox(id string) {
	for _, h := range p.setSandbox(id) {
		h.fn(id, p)
	}
}

// setSandbox registers p under id, and returns the hooks to call.
func (p *Proxy) setSandbox(id string) []*registerHook {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	p.mu.Lock()
	old, closed := p.sandbox, p.closed
	p.sandbox = id
	p.mu.Unlock()
	if registry.byID[old] == p {
		delete(registry.byID, old)
	}
	if closed || id == "" {
		return nil
	}
	if registry.byID == nil {
		registry.byID = map[string]*Proxy{}
	}
	registry.byID[id] = p
	return slices.Clone(registry.hooks)
}

// Registered are the proxies this process runs, by sandbox id.
func Registered() map[string]*Proxy {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	out := make(map[string]*Proxy, len(registry.byID))
	for id, p := range registry.byID {
		out[id] = p
	}
	return out
}

// OnRegister calls fn with each proxy given a sandbox id from now on (SetSandbox: a
// sandbox made, or its proxy started again after a restart), outside the registry's
// lock, until the returned func is called. roched gives a proxy started again the
// values of its stored secrets so.
func OnRegister(fn func(id string, p *Proxy)) (remove func()) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	h := &registerHook{fn: fn}
	registry.hooks = append(registry.hooks, h)
	return func() {
		registry.mu.Lock()
		defer registry.mu.Unlock()
		registry.hooks = slices.DeleteFunc(registry.hooks, func(x *registerHook) bool { return x == h })
	}
}

type registerHook struct{ fn func(string, *Proxy) }

func (p *Proxy) unregister() {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	for id, q := range registry.byID {
		if q == p {
			delete(registry.byID, id)
		}
	}
}

// Sandbox is the id of the sandbox this proxy serves.
func (p *Proxy) Sandbox() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sandbox
}
