package daemon

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/ledger"
)

// metrics are the daemon's Prometheus metrics, on a registry of its own so that several
// daemons (in tests) do not collide.
type metrics struct {
	reg      *prometheus.Registry
	create   *prometheus.HistogramVec
	exec     prometheus.Histogram
	rejected prometheus.Counter
	ended    *prometheus.CounterVec
}

var (
	_ ledger.Observer    = (*metrics)(nil)
	_ ledger.EndObserver = (*metrics)(nil)
)

// Ended counts a sandbox that ended, by why.
func (m *metrics) Ended(kind roche.EndKind) { m.ended.WithLabelValues(string(kind)).Inc() }

// Created observes a create's latency by its source.
func (m *metrics) Created(source string, took time.Duration) {
	m.create.WithLabelValues(source).Observe(took.Seconds())
}

// Executed observes a command's latency.
func (m *metrics) Executed(took time.Duration) { m.exec.Observe(took.Seconds()) }

// Rejected counts a create refused at a bound.
func (m *metrics) Rejected() { m.rejected.Inc() }

// latencyBuckets span a pool hit (sub-millisecond) to a slow cold start (seconds).
var latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

func newMetrics(d *Daemon) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		create: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "roche_create_duration_seconds",
			Help:    "Time to serve a Create, by source: pool (a warm sandbox) or cold (made for the request).",
			Buckets: latencyBuckets,
		}, []string{"source"}),
		exec: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "roche_exec_duration_seconds",
			Help:    "Time to run a command (Exec and ExecStream), from request to result.",
			Buckets: latencyBuckets,
		}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "roche_admission_rejected_total",
			Help: "Creates refused because --max-sandboxes was reached.",
		}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "roche_sandboxes_ended_total",
			Help: "Client sandboxes that ended, by reason: oom, pids, lifetime, command_timeout, output_cap, lease_lost, destroyed, engine_gone, agent_exited, unknown.",
		}, []string{"reason"}),
	}
	for _, k := range roche.EndKinds {
		m.ended.WithLabelValues(string(k)) // every reason shows, at 0 until one happens
	}
	m.reg.MustRegister(m.create, m.exec, m.rejected, m.ended, stateCollector{d},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

var (
	sandboxesDesc = prometheus.NewDesc("roche_sandboxes",
		"Sandboxes the daemon tracks, by state: idle (in a pool), creating, running, paused, destroying, "+
			"and adopted (found on the engine without a record: its own, or an orphan of its state file; reaped at expiry).",
		[]string{"state"}, nil)
	poolHitsDesc   = prometheus.NewDesc("roche_pool_hits_total", "Creates served from a warm pool.", []string{"pool"}, nil)
	poolMissesDesc = prometheus.NewDesc("roche_pool_misses_total", "Creates that matched a pool but found it empty.", []string{"pool"}, nil)
	poolIdleDesc   = prometheus.NewDesc("roche_pool_idle", "Idle sandboxes in a pool.", []string{"pool"}, nil)
	poolDeadDesc   = prometheus.NewDesc("roche_pool_dead_total", "Idle pooled sandboxes found dead (by the engine's events or the check before hand-out) and replaced.", []string{"pool"}, nil)
	engineUpDesc   = prometheus.NewDesc("roche_engine_up",
		"Whether the provider's engine (the Docker engine) answered its last check: 1 up, 0 not answering (creates are refused).",
		[]string{"provider"}, nil)
)

// stateCollector reads counts from the ledger when scraped, so they can never drift
// from it.
type stateCollector struct{ d *Daemon }

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sandboxesDesc
	ch <- poolHitsDesc
	ch <- poolMissesDesc
	ch <- poolIdleDesc
	ch <- poolDeadDesc
	ch <- engineUpDesc
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	counts := c.d.ledger.Counts()
	for _, state := range []string{"idle", "creating", "running", "paused", "destroying", "adopted"} {
		ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(counts[state]), state)
	}
	for _, p := range c.d.ledger.Pools() {
		st := p.Status()
		key := st.Spec.Key.String()
		ch <- prometheus.MustNewConstMetric(poolHitsDesc, prometheus.CounterValue, float64(st.Hits), key)
		ch <- prometheus.MustNewConstMetric(poolMissesDesc, prometheus.CounterValue, float64(st.Misses), key)
		ch <- prometheus.MustNewConstMetric(poolIdleDesc, prometheus.GaugeValue, float64(st.Idle), key)
		ch <- prometheus.MustNewConstMetric(poolDeadDesc, prometheus.CounterValue, float64(st.Dead), key)
	}
	for name, st := range c.d.ledger.Engines() {
		up := 0.0
		if st.Up {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(engineUpDesc, prometheus.GaugeValue, up, name)
	}
}
