package daemon

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/cdc/bypass"
	"github.com/tidb-parity/parity/internal/tso"
)

// The replicator's collector passes the linter and exports every family docs/serve.md
// lists, each even before anything happened; with ha the parity_ha_* ones too.
func TestCDCCollectorMetricsLint(t *testing.T) {
	r, err := cdc.New(func() cdc.Config {
		c := cdc.DefaultConfig()
		c.Changefeed.Brokers = []string{"127.0.0.1:1"}
		c.Changefeed.Topics = []string{"t"}
		c.Downstream.DSN = "root@tcp(127.0.0.1:1)/"
		return c
	}(), nil)
	if err != nil {
		t.Fatal(err)
	}
	status := func() cdc.Status {
		st := r.Status()
		st.Partitions = []cdc.PartitionStatus{{Topic: "t", Partition: 0, ResolvedTs: tso.FromTime(time.Now())}}
		return st
	}
	problems, err := testutil.CollectAndLint(newCDCCollector(status))
	if err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(newCDCCollector(status))
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range fams {
		names = append(names, f.GetName())
	}
	want := []string{"parity_cdc_applied_ddls_total", "parity_cdc_applied_rows_total", "parity_cdc_applier_state",
		"parity_cdc_apply_round_duration_seconds", "parity_cdc_buffered_bytes", "parity_cdc_buffered_rows",
		"parity_cdc_checkpoint_lag_seconds", "parity_cdc_checkpoint_ts_seconds", "parity_cdc_dead_letters_total",
		"parity_cdc_decode_errors_total", "parity_cdc_kafka_lag_messages", "parity_cdc_load_statements_total",
		"parity_cdc_partition_resolved_ts_seconds", "parity_cdc_pending_ddls", "parity_cdc_resolved_lag_seconds",
		"parity_cdc_resolved_ts_seconds", "parity_cdc_retries_total", "parity_cdc_spilled_rows", "parity_cdc_upstream_rows_fetched_total"}
	if !slices.Equal(names, want) {
		t.Fatalf("metric families:\n got %q\nwant %q", names, want)
	}
	// With ha: parity_ha_active, parity_ha_takeovers_total and parity_ha_lease_epoch.
	haStatus := func() cdc.Status {
		st := status()
		st.HA = &cdc.HAStatus{Instance: "a", Role: "standby"}
		return st
	}
	if problems, err := testutil.CollectAndLint(newCDCCollector(haStatus)); err != nil || len(problems) > 0 {
		t.Fatalf("lint with ha: %v %v", problems, err)
	}
	if n := testutil.CollectAndCount(newCDCCollector(haStatus), "parity_ha_active", "parity_ha_takeovers_total", "parity_ha_lease_epoch"); n != 3 {
		t.Fatalf("%d ha metrics, want 3", n)
	}
	// With the simple protocol: parity_cdc_checksum_* from the decoder's Stats.
	simple, err := cdc.New(func() cdc.Config {
		c := cdc.DefaultConfig()
		c.Changefeed.Brokers = []string{"127.0.0.1:1"}
		c.Changefeed.Topics = []string{"t"}
		c.Changefeed.Protocol = cdc.ProtocolSimple
		c.Downstream.DSN = "root@tcp(127.0.0.1:1)/"
		return c
	}(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if problems, err := testutil.CollectAndLint(newCDCCollector(simple.Status)); err != nil || len(problems) > 0 {
		t.Fatalf("lint with simple: %v %v", problems, err)
	}
	if n := testutil.CollectAndCount(newCDCCollector(simple.Status), "parity_cdc_checksum_rows_verified_total",
		"parity_cdc_checksum_rows_without_checksum_total", "parity_cdc_checksum_mismatches_total"); n != 3 {
		t.Fatalf("%d checksum metrics with the simple protocol, want 3", n)
	}
	if n := testutil.CollectAndCount(newCDCCollector(status), "parity_cdc_checksum_rows_verified_total"); n != 0 {
		t.Fatalf("checksum metrics with the open protocol: %d", n)
	}
	counts := func() cdc.Status {
		st := simple.Status()
		st.Checksums = &cdc.ChecksumStats{RowsVerified: 7, RowsWithoutChecksum: 2, Mismatches: 1}
		return st
	}
	wantText := `
# HELP parity_cdc_checksum_mismatches_total With changefeed.protocol simple: row images that do not hash to TiCDC's row checksum or that TiCDC flagged corrupted, since start (each stops its partition, or is dead-lettered).
# TYPE parity_cdc_checksum_mismatches_total counter
parity_cdc_checksum_mismatches_total{changefeed="default"} 1
`
	if err := testutil.CollectAndCompare(newCDCCollector(counts), strings.NewReader(wantText), "parity_cdc_checksum_mismatches_total"); err != nil {
		t.Fatal(err)
	}
}

// The bypass detector's collector passes the linter, exports parity_bypass_* from its
// Stats, and none of them on a standby (activeCollector).
func TestBypassCollector(t *testing.T) {
	stats := func() bypass.Stats {
		return bypass.Stats{Changefeed: "cf", WritesByTable: map[string]int64{"app.t": 3}, LastDetectionTime: time.Unix(1700000000, 0),
			Up: true, Lag: 2 * time.Second}
	}
	c := newBypassCollector("cf", stats)
	if problems, err := testutil.CollectAndLint(c); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
	want := `
# HELP parity_bypass_lag_seconds Seconds since the bypass detector last had read everything the fallback's binlog held (asked every bypass.save-interval); grows while it falls behind or cannot read.
# TYPE parity_bypass_lag_seconds gauge
parity_bypass_lag_seconds{changefeed="cf"} 2
# HELP parity_bypass_writes_total Row changes of replicated tables by transactions parity did not write, recorded from the fallback's binlog since the process started.
# TYPE parity_bypass_writes_total counter
parity_bypass_writes_total{changefeed="cf",table="app.t"} 3
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "parity_bypass_lag_seconds", "parity_bypass_writes_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(c); n != 4 {
		t.Fatalf("%d bypass series, want 4", n)
	}
	active := activeCollector{status: func() cdc.Status { return cdc.Status{} }, c: c}
	standby := activeCollector{status: func() cdc.Status { return cdc.Status{HA: &cdc.HAStatus{Role: "standby"}} }, c: c}
	if n := testutil.CollectAndCount(active); n != 4 {
		t.Fatalf("active: %d bypass series, want 4", n)
	}
	if n := testutil.CollectAndCount(standby); n != 0 {
		t.Fatalf("standby: %d bypass series, want 0", n)
	}
}
