package bypass

import (
	"maps"
	"time"
)

// Stats are the detector's counters for the daemon's metrics (parity_bypass_*: the
// daemon package holds the collector; bypass imports no metrics library).
type Stats struct {
	// Changefeed is the changefeed the detector watches for (bypass.Config.Changefeed).
	Changefeed string
	// WritesByTable counts the row changes recorded since the process started, by
	// schema.table.
	WritesByTable map[string]int64
	// LastDetectionTime is the binlog commit time of the newest recorded change, kept
	// across restarts (zero: none).
	LastDetectionTime time.Time
	// Up is true while the binlog is being read.
	Up bool
	// Lag is how long ago the detector last had read everything the fallback's binlog
	// held: it grows while the detector falls behind or cannot read.
	Lag time.Duration
}

// Stats returns the detector's counters.
func (d *Detector) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return Stats{Changefeed: d.cfg.Changefeed, WritesByTable: maps.Clone(d.byTable), LastDetectionTime: d.st.LastDetectionTime,
		Up: d.up, Lag: d.lagLocked(time.Now())}
}
