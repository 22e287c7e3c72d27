// Command egress benchmarks the egress proxy's TLS interception against baselines
// measured in the same run (shared machines are noisy, so only same-run figures mean
// anything): an HTTPS server on 127.0.0.1 (its certificate from a test CA) is asked
//
//   - directly (the floor),
//   - through the proxy with a plain host:port entry (a CONNECT tunnel, TLS end to end),
//   - through the proxy with an https:// entry (intercepted: the proxy ends the client's
//     TLS with the sandbox's CA, checks the request, and re-originates it),
//
// for the latency of one small GET on a kept-alive connection and on a new connection
// each (p50 and p90 of -n requests; the intercepted one's added latency over the plain
// proxy, target <= 2 ms at p50), and for the throughput of a -mib MiB download (the
// median of 3; target >= 300 MiB/s intercepted). It needs nothing but Go: run it with
// `make bench` or go run ./bench/egress.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/roche-sandbox/roche/egress"
	"github.com/roche-sandbox/roche/internal/localca"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench/egress:", err)
		os.Exit(1)
	}
}

func run() error {
	n := flag.Int("n", 300, "requests per latency measurement")
	mib := flag.Int("mib", 256, "MiB per throughput download")
	flag.Parse()

	testCA, err := localca.New("bench upstream CA", time.Hour)
	if err != nil {
		return err
	}
	upstream, err := startUpstream(testCA)
	if err != nil {
		return err
	}
	defer upstream.Close()
	target := upstream.Addr().String()
	roots := x509.NewCertPool()
	roots.AddCert(testCA.Cert)

	plain, err := startProxy(egress.Options{}, target)
	if err != nil {
		return err
	}
	defer plain.Close()
	ca, err := egress.NewCA("bench")
	if err != nil {
		return err
	}
	inter, err := startProxy(egress.Options{CA: ca, Roots: roots}, "https://"+target+"/")
	if err != nil {
		return err
	}
	defer inter.Close()
	caPool := x509.NewCertPool()
	caPool.AddCert(ca.Cert)

	modes := []struct {
		name  string
		proxy *url.URL
		roots *x509.CertPool
	}{
		{"direct", nil, roots},
		{"plain proxy (CONNECT tunnel)", plain.url, roots},
		{"intercepted proxy (https:// entry)", inter.url, caPool},
	}
	fmt.Printf("egress proxy on loopback, upstream https://%s (HTTP/2 offered), %d requests each, %d MiB downloads\n\n", target, *n, *mib)
	fmt.Printf("%-36s %12s %12s %12s %12s %12s\n", "", "warm p50", "warm p90", "cold p50", "cold p90", "MiB/s")
	p50s := map[string][2]time.Duration{}
	rates := map[string]float64{}
	for _, m := range modes {
		warm, err := latencies(m.proxy, m.roots, target, *n, true)
		if err != nil {
			return fmt.Errorf("%s: %w", m.name, err)
		}
		cold, err := latencies(m.proxy, m.roots, target, *n, false)
		if err != nil {
			return fmt.Errorf("%s: %w", m.name, err)
		}
		var rs []float64
		for range 3 {
			r, err := throughput(m.proxy, m.roots, target, *mib)
			if err != nil {
				return fmt.Errorf("%s: %w", m.name, err)
			}
			rs = append(rs, r)
		}
		slices.Sort(rs)
		rates[m.name] = rs[1]
		p50s[m.name] = [2]time.Duration{pct(warm, 50), pct(cold, 50)}
		fmt.Printf("%-36s %12s %12s %12s %12s %12.0f\n", m.name, ms(pct(warm, 50)), ms(pct(warm, 90)), ms(pct(cold, 50)), ms(pct(cold, 90)), rs[1])
	}
	pl, in := p50s[modes[1].name], p50s[modes[2].name]
	fmt.Printf("\nadded by interception over the plain proxy, p50: %s warm (target <= 2 ms), %s on a new connection\n", ms(in[0]-pl[0]), ms(in[1]-pl[1]))
	fmt.Printf("throughput intercepted: %.0f MiB/s (target >= 300), %.2fx the plain proxy's, %.2fx direct\n",
		rates[modes[2].name], rates[modes[2].name]/rates[modes[1].name], rates[modes[2].name]/rates[modes[0].name])
	return nil
}

func ms(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 3, 64) + " ms" }

func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

// startUpstream serves GET /small (32 bytes) and GET /big?mib=N over TLS, HTTP/2 offered.
func startUpstream(ca *localca.CA) (net.Listener, error) {
	leaf, err := ca.Server([]string{"127.0.0.1"}, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	chunk := make([]byte, 1<<20)
	srv := &http.Server{
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/small" {
				_, _ = w.Write(chunk[:32])
				return
			}
			n, _ := strconv.Atoi(r.URL.Query().Get("mib"))
			w.Header().Set("Content-Length", strconv.Itoa(n<<20))
			for range n {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		}),
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	return ln, nil
}

type proxy struct {
	px  *egress.Proxy
	ln  net.Listener
	url *url.URL
}

func (p *proxy) Close() { p.px.Close(); p.ln.Close() }

func startProxy(opts egress.Options, entry string) (*proxy, error) {
	pol, err := egress.ParsePolicy([]string{entry})
	if err != nil {
		return nil, err
	}
	opts.Policy = pol
	opts.MaxBytes = 1 << 40
	opts.MaxConns = 1024
	px := egress.New(opts)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() { _ = px.Serve(ln) }()
	return &proxy{px: px, ln: ln, url: &url.URL{Scheme: "http", Host: ln.Addr().String()}}, nil
}

func client(proxyURL *url.URL, roots *x509.CertPool, keepAlive bool) *http.Client {
	tr := &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		DisableKeepAlives: !keepAlive,
		ForceAttemptHTTP2: true,
	}
	if proxyURL != nil {
		tr.Proxy = http.ProxyURL(proxyURL)
	}
	return &http.Client{Transport: tr, Timeout: time.Minute}
}

func get(c *http.Client, u string) (int64, error) {
	resp, err := c.Get(u)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return n, err
}

// latencies times n GETs of /small, after one not counted (to open the connection when
// kept alive).
func latencies(proxyURL *url.URL, roots *x509.CertPool, target string, n int, keepAlive bool) ([]time.Duration, error) {
	c := client(proxyURL, roots, keepAlive)
	defer c.CloseIdleConnections()
	u := "https://" + target + "/small"
	if _, err := get(c, u); err != nil {
		return nil, err
	}
	out := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		if _, err := get(c, u); err != nil {
			return nil, err
		}
		out = append(out, time.Since(start))
	}
	return out, nil
}

// throughput downloads mib MiB and returns MiB/s.
func throughput(proxyURL *url.URL, roots *x509.CertPool, target string, mib int) (float64, error) {
	c := client(proxyURL, roots, true)
	defer c.CloseIdleConnections()
	start := time.Now()
	n, err := get(c, "https://"+target+"/big?mib="+strconv.Itoa(mib))
	if err != nil {
		return 0, err
	}
	if n != int64(mib)<<20 {
		return 0, fmt.Errorf("downloaded %d bytes, want %d", n, int64(mib)<<20)
	}
	return float64(n) / (1 << 20) / time.Since(start).Seconds(), nil
}
