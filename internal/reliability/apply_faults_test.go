package reliability

import (
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/internal/testenv"
)

// applyFault is a network fault between the applier and Kafka or the fallback.
type applyFault struct {
	name   string
	kafka  bool // the fault is on the Kafka connections; else on the fallback's
	toxics []testenv.Toxic
	cut    bool          // close every connection and refuse new ones
	hold   time.Duration // how long the fault lasts
	// budget: the fault outlasts the applier's retry budget (applier.max-retries 3,
	// retry-backoff 100ms; changefeed.retry-timeout 3s): Run must stop with an error containing each of wantErr,
	// and a new replicator resumes from the checkpoint.
	budget  bool
	wantErr []string
	// wantLog is a line the applier logs while the fault lasts (its retry path);
	// "" when the fault only slows it down.
	wantLog string
}

var applyFaults = []applyFault{
	{name: "kafka/latency-jitter", kafka: true, hold: 5 * time.Second, toxics: []testenv.Toxic{
		{Type: "latency", Stream: "downstream", Attributes: map[string]any{"latency": 300, "jitter": 200}},
		{Type: "latency", Stream: "upstream", Attributes: map[string]any{"latency": 100, "jitter": 50}}}},
	{name: "kafka/bandwidth", kafka: true, hold: 5 * time.Second, toxics: []testenv.Toxic{
		{Type: "bandwidth", Stream: "downstream", Attributes: map[string]any{"rate": 8}}}}, // KB/s
	{name: "kafka/reset-mid-fetch", kafka: true, hold: 4 * time.Second, wantLog: "kafka unavailable; reconnecting", toxics: []testenv.Toxic{
		{Type: "reset_peer", Stream: "downstream", Attributes: map[string]any{"timeout": 50}}}},
	{name: "kafka/stops-answering", kafka: true, hold: 8 * time.Second, wantLog: "kafka reader", toxics: []testenv.Toxic{
		{Type: "timeout", Stream: "downstream", Attributes: map[string]any{"timeout": 0}}}},
	{name: "kafka/cut", kafka: true, hold: 10 * time.Second, cut: true, wantLog: "kafka unavailable; reconnecting"},
	{name: "kafka/cut-beyond-retry-budget", kafka: true, hold: 8 * time.Second, cut: true, budget: true,
		wantErr: []string{"kafka unavailable for", "changefeed.retry-timeout 3s", "connection refused"}},
	{name: "fallback/latency-jitter", hold: 5 * time.Second, toxics: []testenv.Toxic{
		{Type: "latency", Stream: "downstream", Attributes: map[string]any{"latency": 40, "jitter": 30}},
		{Type: "latency", Stream: "upstream", Attributes: map[string]any{"latency": 10, "jitter": 10}}}},
	{name: "fallback/bandwidth", hold: 5 * time.Second, toxics: []testenv.Toxic{
		{Type: "bandwidth", Stream: "upstream", Attributes: map[string]any{"rate": 16}}}},
	// Every connection, open or new, is reset 30ms into its life under the fault: a round in
	// flight loses its connection mid-statement. (At toxicity 0.5 each connection drew once
	// whether it was reset; the applier's few pooled connections all drew "no" in one CI
	// run, and the fault never met it.)
	{name: "fallback/reset-mid-round", hold: 3 * time.Second, wantLog: "transient downstream error, retrying", toxics: []testenv.Toxic{
		{Type: "reset_peer", Stream: "upstream", Attributes: map[string]any{"timeout": 30}}}},
	{name: "fallback/stops-answering", hold: 7 * time.Second, wantLog: "transient downstream error, retrying", toxics: []testenv.Toxic{
		{Type: "timeout", Stream: "downstream", Attributes: map[string]any{"timeout": 0}}}},
	{name: "fallback/cut-beyond-retry-budget", hold: 8 * time.Second, cut: true, budget: true,
		wantErr: []string{"connection refused"}},
}

// TestApplierFaults runs the applier (cdc.Replicator, as parity serve runs it) under a
// steady loadgen workload while one network fault hits its Kafka connections (through a
// private broker whose advertised listener is the proxy) or its fallback connections:
// latency with jitter, a bandwidth limit, connections reset mid-fetch or mid-round, a
// server that stops answering, and cuts, one of them longer than the retry budget. The
// applier must ride through each fault (retrying, with the retries in its log) or stop
// with a clear error and resume from its checkpoint when started again; the fallback
// must then equal TiDB at the final resolved ts, row for row. The time from the end of
// the fault until the applier has applied everything committed before that moment is
// logged (docs/reliability.md).
func TestApplierFaults(t *testing.T) {
	t.Parallel()
	upDSN := testenv.Require(t, testenv.EnvUpstream)
	downDSN := testenv.Require(t, testenv.EnvDownstream)
	up := openSchema(t, upDSN, "")
	k := testenv.StartKafka(t, len(applyFaults))
	for i, f := range applyFaults {
		kp := k.Proxies[i]
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			topic := k.NewTopic(t, "rel", 3)
			dp := testenv.NewProxy(t, "fallback-"+f.name, addrOf(t, downDSN))
			l, importTs := startLoad(t, loadConfig(t, upDSN, downDSN, k.Addr, topic, 40, uint64(i+1)))
			cfg := replicatorConfig(t, kp.Addr, topic, dp.DSN(t, downDSN), downDSN, importTs)
			if f.budget {
				cfg.Applier.MaxRetries, cfg.Applier.RetryBackoff = 3, 100*time.Millisecond
				cfg.Changefeed.RetryTimeout = 3 * time.Second
			}
			r := startReplicator(t, cfg)
			r.progressed(t, importTs)

			p := dp
			if f.kafka {
				p = kp
			}
			faultStart := time.Now()
			if f.cut {
				p.Cut()
			}
			for _, x := range f.toxics {
				p.Add(t, x)
			}
			var failed error
			var failedAfter time.Duration
			for time.Since(faultStart) < f.hold {
				if ok, err := r.ended(); ok && failed == nil {
					failed, failedAfter = err, time.Since(faultStart)
					if !f.budget {
						t.Fatalf("the applier stopped %v into the fault: %v", fmtDur(failedAfter), err)
					}
				}
				time.Sleep(50 * time.Millisecond)
			}
			if f.budget && failed == nil {
				t.Fatalf("the applier still runs %v into a cut longer than its retry budget (status %+v)", fmtDur(f.hold), r.Status())
			}
			p.RemoveAll(t)
			if f.cut {
				p.Restore(t)
			}
			faultEnd := time.Now()
			if f.budget {
				if failed == nil || r.Status().State != "failed" {
					t.Fatalf("want a stopped applier in state failed, got %v, %+v", failed, r.Status())
				}
				for _, w := range f.wantErr {
					if !strings.Contains(failed.Error(), w) {
						t.Errorf("the applier's error lacks %q: %v", w, failed)
					}
				}
				t.Logf("the applier stopped %v into the cut: %v", fmtDur(failedAfter), failed)
				r = startReplicator(t, cfg) // parity serve restarted by its supervisor
			}
			if f.wantLog != "" && !f.budget && r.log.Count(f.wantLog) == 0 {
				t.Errorf("the applier logged no %q during the fault", f.wantLog)
			}
			ts := testenv.TiDBTSO(t, up)
			r.waitApplied(t, ts, 2*time.Minute)
			t.Logf("recovery: applied everything committed before the fault ended %v after its end (fault held %v; %d retry lines, %d kafka reader lines)",
				fmtDur(time.Since(faultEnd)), fmtDur(f.hold), r.log.Count("retrying"), r.log.Count("kafka reader"))
			time.Sleep(time.Second)
			res, err := l.stop()
			if err != nil {
				t.Fatalf("loadgen: %v", err)
			}
			r.waitApplied(t, res.ResolvedTs, 2*time.Minute)
			if err := r.stop(); err != nil {
				t.Fatalf("the applier's Run: %v", err)
			}
			t.Logf("loadgen: %d transactions, %d rows", res.Transactions, res.Rows)
			assertSameAt(t, upDSN, downDSN, l.cfg.Database, res.ResolvedTs)
		})
	}
}

// addrOf returns the host:port of a TCP DSN.
func addrOf(t *testing.T, dsn string) string {
	t.Helper()
	c, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return c.Addr
}
