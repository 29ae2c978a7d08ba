package testenv

// Network faults for tests: a toxiproxy TCP proxy (github.com/Shopify/toxiproxy/v2, run
// in-process, no toxiproxy server or HTTP API) between the code under test and a real
// server, on a loopback port chosen at run time. Toxics (latency, bandwidth, reset_peer,
// timeout, slicer, limit_data) act on the connections through one proxy only, so a test
// can put the shared servers behind its own proxy without disturbing other tests.

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

var (
	toxiOnce   sync.Once
	toxiServer *toxiproxy.ApiServer
)

// toxiproxyServer is the process's one toxiproxy server: the proxies' owner (its API is
// never started).
func toxiproxyServer() *toxiproxy.ApiServer {
	toxiOnce.Do(func() {
		toxiServer = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	})
	return toxiServer
}

// Proxy is a TCP proxy in front of one server.
type Proxy struct {
	// Addr is the proxy's address (host:port): connect here instead of Upstream.
	Addr     string
	Upstream string
	p        *toxiproxy.Proxy
}

// NewProxy starts a proxy on a free loopback port forwarding to upstream (host:port);
// it is stopped when the test ends.
func NewProxy(t testing.TB, name, upstream string) *Proxy {
	t.Helper()
	return NewProxyAt(t, name, "127.0.0.1:0", upstream)
}

// NewProxyAt starts a proxy listening on listen (host:port; port 0 picks one).
// upstream need not answer yet: the proxy dials it for each connection it accepts.
func NewProxyAt(t testing.TB, name, listen, upstream string) *Proxy {
	t.Helper()
	p := toxiproxy.NewProxy(toxiproxyServer(), name, listen, upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("start proxy %s to %s: %v", name, upstream, err)
	}
	t.Cleanup(p.Stop)
	return &Proxy{Addr: p.Listen, Upstream: upstream, p: p}
}

// DSN returns dsn (a go-sql-driver/mysql DSN) with its address replaced by the proxy's.
func (p *Proxy) DSN(t testing.TB, dsn string) string {
	t.Helper()
	return ReplaceAddr(t, dsn, p.Addr)
}

// Toxic is one toxic: Type is latency, bandwidth, reset_peer, timeout, slicer,
// limit_data or slow_close; Stream is "upstream" (client to server) or "downstream"
// (server to client, the default); Toxicity is the share of connections it acts on
// (0 means 1); Attributes are the type's (latency/jitter in ms, rate in KB/s, timeout in
// ms, bytes).
type Toxic struct {
	Name       string
	Type       string
	Stream     string
	Toxicity   float32
	Attributes map[string]any
}

// Add adds a toxic; it acts on the open connections and on every new one.
func (p *Proxy) Add(t testing.TB, x Toxic) {
	t.Helper()
	if x.Stream == "" {
		x.Stream = "downstream"
	}
	if x.Toxicity == 0 {
		x.Toxicity = 1
	}
	if x.Name == "" {
		x.Name = x.Type + "_" + x.Stream
	}
	var attrs []string
	for k, v := range x.Attributes {
		attrs = append(attrs, fmt.Sprintf("%q:%v", k, v))
	}
	js := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":%g,"attributes":{%s}}`,
		x.Name, x.Type, x.Stream, x.Toxicity, strings.Join(attrs, ","))
	if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
		t.Fatalf("proxy %s: add toxic %s: %v", p.p.Name, js, err)
	}
}

// Remove removes the toxic named name.
func (p *Proxy) Remove(t testing.TB, name string) {
	t.Helper()
	if err := p.p.Toxics.RemoveToxic(t.Context(), name); err != nil {
		t.Fatalf("proxy %s: remove toxic %s: %v", p.p.Name, name, err)
	}
}

// RemoveAll removes every toxic.
func (p *Proxy) RemoveAll(t testing.TB) {
	t.Helper()
	p.p.Toxics.ResetToxics(t.Context())
}

// Cut closes every connection through the proxy and its listener: connecting is refused
// until Restore.
func (p *Proxy) Cut() { p.p.Stop() }

// Restore listens again on the same address.
func (p *Proxy) Restore(t testing.TB) {
	t.Helper()
	if err := p.p.Start(); err != nil {
		t.Fatalf("restart proxy %s on %s: %v", p.p.Name, p.Addr, err)
	}
}
