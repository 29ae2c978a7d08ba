package main

// bypass_ha.go: the bypass detector under [ha]. Only the daemon holding the changefeed's
// lease reads the fallback's binlog (serve runs the detector through
// cdc.Replicator.WhileActive): one bypass.server-id serves every daemon of a changefeed,
// and two daemons never evict each other's binlog connection (ERROR 4052). A standby
// says so in /status (bypass.state "standby") and exports no parity_bypass_* series, so
// that the lag of a detector it does not run raises no alert.

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/cdc/bypass"
)

// bypassStateStandby is /status bypass.state on a daemon that does not hold the lease.
const bypassStateStandby = "standby"

// standingBy reports whether r, with ha.enabled, does not hold the lease (a standby, or
// not yet known: the detector does not run either way).
func standingBy(st cdc.Status) bool {
	return st.HA != nil && st.HA.Role != "active"
}

// bypassStatus is the detector's /status on a daemon whose replicator status is st. A
// standby's says state standby and keeps only what this process detected while it was
// active (detections, the newest ones, the newest's time): no position, binlog end or
// lag, which belong to the daemon reading (a detector that does not run has a lag that
// only grows).
func bypassStatus(st cdc.Status, bd *bypass.Detector) *bypass.Status {
	b := bd.Status()
	if standingBy(st) {
		b = bypass.Status{State: bypassStateStandby, Detections: b.Detections, Recent: b.Recent, LastDetectionTime: b.LastDetectionTime}
	}
	return &b
}

// activeCollector collects c only while r is not standing by.
type activeCollector struct {
	r *cdc.Replicator
	c prometheus.Collector
}

var _ prometheus.Collector = activeCollector{}

func (a activeCollector) Describe(ch chan<- *prometheus.Desc) { a.c.Describe(ch) }

func (a activeCollector) Collect(ch chan<- prometheus.Metric) {
	if !standingBy(a.r.Status()) {
		a.c.Collect(ch)
	}
}
