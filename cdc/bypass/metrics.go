package bypass

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports a Detector's state as Prometheus metrics.
type Collector struct {
	d                         *Detector
	writes, last, upDesc, lag *prometheus.Desc
}

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns the metrics of d: parity_bypass_writes_total{changefeed,table}
// (row changes recorded since the process started, by schema.table),
// parity_bypass_last_write_timestamp_seconds{changefeed} (binlog commit time of the
// newest recorded change, kept across restarts; 0 when none) and
// parity_bypass_up{changefeed} (1 while the binlog is being read) and
// parity_bypass_lag_seconds{changefeed} (how long ago the detector last had read
// everything the fallback's binlog held: it grows while it falls behind or cannot read).
func NewCollector(d *Detector) *Collector {
	cf := prometheus.Labels{"changefeed": d.cfg.Changefeed}
	return &Collector{
		d: d,
		writes: prometheus.NewDesc("parity_bypass_writes_total",
			"Row changes of replicated tables by transactions parity did not write, recorded from the fallback's binlog since the process started.",
			[]string{"table"}, cf),
		last: prometheus.NewDesc("parity_bypass_last_write_timestamp_seconds",
			"Binlog commit time of the newest recorded write that bypassed parity (0: none).", nil, cf),
		upDesc: prometheus.NewDesc("parity_bypass_up",
			"1 while the bypass detector reads the fallback's binlog, 0 while it reconnects or is stopped.", nil, cf),
		lag: prometheus.NewDesc("parity_bypass_lag_seconds",
			"Seconds since the bypass detector last had read everything the fallback's binlog held (asked every bypass.save-interval); grows while it falls behind or cannot read.", nil, cf),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.writes
	ch <- c.last
	ch <- c.upDesc
	ch <- c.lag
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	d := c.d
	d.mu.Lock()
	defer d.mu.Unlock()
	for table, n := range d.byTable {
		ch <- prometheus.MustNewConstMetric(c.writes, prometheus.CounterValue, float64(n), table)
	}
	var last float64
	if !d.st.LastDetectionTime.IsZero() {
		last = float64(d.st.LastDetectionTime.UnixNano()) / 1e9
	}
	ch <- prometheus.MustNewConstMetric(c.last, prometheus.GaugeValue, last)
	up := 0.0
	if d.up {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(c.upDesc, prometheus.GaugeValue, up)
	ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, d.lagLocked(time.Now()).Seconds())
}
