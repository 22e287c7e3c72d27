package daemon

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/egress"
	"github.com/roche-sandbox/roche/internal/ledger"
	"github.com/roche-sandbox/roche/internal/wire"
)

// The egress proxies are the providers' (package egress); roched finds a sandbox's by its
// id (egress.Lookup) to read its decision log and change its allowlist, and observes
// every decision of its own sandboxes' proxies: counted in metrics, written to the audit
// log.

// observeEgress counts and audits the final decisions of the proxies of the sandboxes
// this daemon tracks, until the returned func is called.
func (d *Daemon) observeEgress() func() {
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "roche_egress_decisions_total",
		Help: "Connections and plain HTTP requests the sandboxes' egress proxies decided on, by decision: allowed or refused.",
	}, []string{"decision"})
	bytes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "roche_egress_bytes_total",
		Help: "Bytes the egress proxies relayed for allowed connections, by direction: out (to the upstream) or in, counted when each connection ends.",
	}, []string{"direction"})
	d.metrics.reg.MustRegister(decisions, bytes)
	return egress.Observe(func(dec egress.Decision) {
		rec, ok := d.ledger.Tracked(dec.Sandbox)
		if !ok {
			return // another daemon's, in the same process (tests)
		}
		var err error
		label := "allowed"
		if !dec.Allowed {
			label, err = "refused", errors.New(dec.Reason)
		}
		d.learning.observe(dec)
		decisions.WithLabelValues(label).Inc()
		bytes.WithLabelValues("out").Add(float64(dec.BytesOut))
		bytes.WithLabelValues("in").Add(float64(dec.BytesIn))
		d.ledger.Audit(rec.TenantName(), "egress", err, "id", dec.Sandbox, "seq", dec.Seq, "host", dec.Host, "port", dec.Port,
			"addr", dec.Addr, "method", dec.Method, "path", dec.Path, "rule", dec.Rule, "bytes_out", dec.BytesOut, "bytes_in", dec.BytesIn)
	})
}

// egressProxy finds the proxy of a sandbox of the caller's.
func (s *service) egressProxy(ctx context.Context, id string) (*egress.Proxy, string, error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, "", err
	}
	tg, err := s.d.ledger.Resolve(t, id)
	if err != nil {
		return nil, "", err
	}
	px := egress.Lookup(tg.ID)
	if px == nil {
		return nil, "", fmt.Errorf("%w: sandbox %s has no egress proxy in this roched: only a sandbox made with a network allowlist (--allow-host) has one", roche.ErrNotFound, id)
	}
	return px, t.Name, nil
}

func (s *service) EgressLog(ctx context.Context, req *connect.Request[rochev1.EgressLogRequest]) (*connect.Response[rochev1.EgressLogResponse], error) {
	px, tenant, err := s.egressProxy(ctx, req.Msg.SandboxId)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	ds, dropped := px.Log(req.Msg.After)
	resp := &rochev1.EgressLogResponse{Dropped: dropped, Suggested: s.d.learning.suggest(px.Sandbox(), ds)}
	for _, d := range ds {
		resp.Decisions = append(resp.Decisions, decisionToProto(d, tenant))
	}
	return connect.NewResponse(resp), nil
}

func decisionToProto(d egress.Decision, tenant string) *rochev1.EgressDecision {
	return &rochev1.EgressDecision{
		Seq: d.Seq, Time: timestamppb.New(d.Time), SandboxId: d.Sandbox, Tenant: tenant, Host: d.Host, Port: int32(d.Port),
		Addr: d.Addr, Method: d.Method, Path: d.Path, Rule: d.Rule, Allowed: d.Allowed, Reason: d.Reason,
		BytesOut: d.BytesOut, BytesIn: d.BytesIn, Done: d.Done,
	}
}

// EgressEvents streams the final decisions of a sandbox's proxy: those kept first, then
// each as it is made (egress.Observe), heartbeats while it is quiet.
func (s *service) EgressEvents(ctx context.Context, req *connect.Request[rochev1.EgressEventsRequest], stream *connect.ServerStream[rochev1.EgressEventsResponse]) error {
	px, tenant, err := s.egressProxy(ctx, req.Msg.SandboxId)
	if err != nil {
		return wire.ToStatus(err)
	}
	id := px.Sandbox()
	events := make(chan egress.Decision, 256)
	var missed atomic.Uint64
	stop := egress.Observe(func(dec egress.Decision) {
		if dec.Sandbox != id {
			return
		}
		select {
		case events <- dec:
		default:
			missed.Add(1) // a slow reader: counted, never blocking the proxy
		}
	})
	defer stop()
	sender := newSender(stream)
	defer sender.close()
	send := func(dec egress.Decision) error {
		return sender.send(&rochev1.EgressEventsResponse{Decision: decisionToProto(dec, tenant), Missed: missed.Swap(0)})
	}
	// Observing began before the log is read: a decision made in between comes twice,
	// and the second is skipped by its seq.
	sent := map[uint64]bool{}
	kept, _ := px.Log(req.Msg.After)
	for _, dec := range kept {
		if dec.Done || !dec.Allowed {
			if err := send(dec); err != nil {
				return err
			}
			sent[dec.Seq] = true
		}
	}
	tick := time.NewTicker(s.d.cfg.HeartbeatInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.d.draining:
			return nil
		case dec := <-events:
			if sent[dec.Seq] || dec.Seq <= req.Msg.After {
				delete(sent, dec.Seq)
				continue
			}
			if err := send(dec); err != nil {
				return err
			}
		case <-tick.C:
			if egress.Lookup(id) != px {
				return nil // the sandbox's proxy closed: nothing more will come
			}
			if err := sender.send(&rochev1.EgressEventsResponse{Heartbeat: true, Missed: missed.Swap(0)}); err != nil {
				return err
			}
		}
	}
}

// learnEntry is the allowlist entry a learn-mode sandbox created without one is given so
// that it has a proxy: a name under .invalid (RFC 6761), which never resolves, so the
// proxy allows nothing.
const learnEntry = "learn.roche.invalid"

// maxLearned bounds the entries kept for one learn-mode sandbox.
const maxLearned = 1000

// clientOwners gives, for each client sandbox the ledger holds, its tenant.
func (d *Daemon) clientOwners() map[string]string {
	out := map[string]string{}
	for _, r := range d.ledger.Records() {
		if r.Kind == ledger.KindClient {
			out[r.ID] = r.TenantName()
		}
	}
	return out
}

// prepareEgress fills a create's stored secrets and gives a learn-mode sandbox without
// an allowlist its proxy.
func (d *Daemon) prepareEgress(tenant string, cfg *roche.Config) error {
	if err := d.secrets.fill(tenant, cfg.Secrets); err != nil {
		return err
	}
	if cfg.EgressLearn && len(cfg.NetworkAllowlist) == 0 && !cfg.Network {
		cfg.NetworkAllowlist = []string{learnEntry}
	}
	return nil
}

// startedEgress follows a sandbox made with stored secrets or in learn mode.
func (d *Daemon) startedEgress(tenant, id string, cfg roche.Config) {
	d.secrets.follow(tenant, id)
	if cfg.EgressLearn {
		d.learning.start(id)
	}
}

// secretValues are the values the proxy of sandbox id holds, taken before it is made
// again (Reset, Fork), whose new proxies start without (the config they are made from
// holds no value).
func (d *Daemon) secretValues(t *ledger.Tenant, id string) map[string]string {
	tg, err := d.ledger.Resolve(t, id)
	if err != nil {
		return nil // the call refuses it too
	}
	if px := egress.Lookup(tg.ID); px != nil {
		return px.SecretValues()
	}
	return nil
}

// remadeEgress gives the sandboxes ids, made again from another's config whose proxy
// held values (secretValues), those values, then the store's for their stored secrets,
// which they follow as the first did.
func (d *Daemon) remadeEgress(tenant string, values map[string]string, ids ...string) {
	for _, id := range ids {
		if px := egress.Lookup(id); px != nil {
			for n, v := range values {
				px.SetSecret(n, v)
			}
		}
	}
	d.secrets.follow(tenant, ids...)
}

// learnSet keeps, per learn-mode sandbox, every entry its refusals needed (egress.Suggest
// of each final decision), beyond the bounded decision log.
type learnSet struct {
	mu   sync.Mutex
	byID map[string]*learned
}

type learned struct {
	entries []string
	seen    map[string]bool
}

func (l *learnSet) start(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byID == nil {
		l.byID = map[string]*learned{}
	}
	for old := range l.byID {
		if egress.Lookup(old) == nil {
			delete(l.byID, old) // ended
		}
	}
	if l.byID[id] == nil {
		l.byID[id] = &learned{seen: map[string]bool{}}
	}
}

func (l *learnSet) observe(dec egress.Decision) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lr := l.byID[dec.Sandbox]
	if lr == nil {
		return
	}
	for _, e := range egress.Suggest([]egress.Decision{dec}) {
		if !lr.seen[e] && len(lr.entries) < maxLearned {
			lr.seen[e] = true
			lr.entries = append(lr.entries, e)
		}
	}
}

// suggest is what the sandbox learnt (in learn mode) and what its kept log suggests, each
// entry once, in the order first needed.
func (l *learnSet) suggest(id string, ds []egress.Decision) []string {
	l.mu.Lock()
	var out []string
	if lr := l.byID[id]; lr != nil {
		out = slices.Clone(lr.entries)
	}
	l.mu.Unlock()
	for _, e := range egress.Suggest(ds) {
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	return out
}

func (s *service) EgressPolicy(ctx context.Context, req *connect.Request[rochev1.EgressPolicyRequest]) (*connect.Response[rochev1.EgressPolicyResponse], error) {
	px, _, err := s.egressProxy(ctx, req.Msg.SandboxId)
	if err == nil {
		err = changePolicy(px, req.Msg.Allow, req.Msg.Remove)
	}
	s.d.audit(ctx, "egress_policy", err, "id", req.Msg.SandboxId, "allow", req.Msg.Allow, "remove", req.Msg.Remove)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	resp := &rochev1.EgressPolicyResponse{}
	for _, r := range px.Policy().Rules {
		resp.Rules = append(resp.Rules, r.String())
	}
	return connect.NewResponse(resp), nil
}

// changePolicy checks every entry first, so that a bad one changes nothing.
func changePolicy(px *egress.Proxy, allow, remove []string) error {
	add, err := egress.ParsePolicy(allow)
	if err != nil {
		return fmt.Errorf("%w: %v", roche.ErrInvalidConfig, err)
	}
	drop, err := egress.ParsePolicy(remove)
	if err != nil {
		return fmt.Errorf("%w: %v", roche.ErrInvalidConfig, err)
	}
	if add.Intercepts() && !px.CanIntercept() {
		return fmt.Errorf("%w: this sandbox has no egress CA, so it cannot take https:// entries: create it with one (an https:// --allow-host entry or a --secret)", roche.ErrInvalidConfig)
	}
	have := px.Policy()
	for _, r := range drop.Rules {
		if !slicesContainsRule(have.Rules, r) && !slicesContainsRule(add.Rules, r) {
			return fmt.Errorf("%w: %s is not in the sandbox's allowlist (it has %s)", roche.ErrInvalidConfig, r, rulesString(have.Rules))
		}
	}
	px.Allow(add.Rules...)
	px.Remove(drop.Rules...)
	return nil
}

func slicesContainsRule(rs []egress.Rule, r egress.Rule) bool {
	for _, q := range rs {
		if q.String() == r.String() {
			return true
		}
	}
	return false
}

func rulesString(rs []egress.Rule) string {
	if len(rs) == 0 {
		return "no entries"
	}
	s := ""
	for i, r := range rs {
		if i > 0 {
			s += ", "
		}
		s += r.String()
	}
	return s
}
