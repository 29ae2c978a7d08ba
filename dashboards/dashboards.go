// Package dashboards defines parity's Grafana dashboards in Go and writes them as the
// JSON files beside it (go test ./dashboards -update): one definition keeps the four
// dashboards' variables, units, thresholds and queries consistent, and the committed
// JSON is what Grafana loads and what the observability test (cmd/parity) evaluates
// against a live daemon. It imports nothing of parity's.
package dashboards

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// SchemaVersion is Grafana 11's dashboard schema version (read by Grafana 11 and 12).
const SchemaVersion = 39

// cf is the changefeed selector every query carries.
const cf = `changefeed=~"$changefeed"`

var ds = map[string]string{"type": "prometheus", "uid": "${datasource}"}

// Target is one query of a panel.
type Target struct {
	Expr   string
	Legend string
}

// Panel is one panel (or a row, with Type "row").
type Panel struct {
	Type        string // timeseries, stat, row
	Title       string
	Description string
	Unit        string
	// Thresholds are the steps above the base (green): value → color.
	Thresholds []Step
	// Base is the base color (default green).
	Base     string
	Mappings []map[string]any
	Targets  []Target
	W, H     int
	// TextName shows the series name (the legend) instead of the value in a stat.
	TextName bool
}

// Step is one threshold step.
type Step struct {
	Value float64
	Color string
}

// Dashboard is one dashboard.
type Dashboard struct {
	UID, Title, Description string
	Panels                  []Panel
	// Fleet adds the member variable: the member label Prometheus attaches to each
	// fleet member's scraped daemons (deploy/prometheus/prometheus-fleet.yml).
	Fleet bool
}

func (d Dashboard) json() ([]byte, error) {
	var panels []any
	x, y, rowH := 0, 0, 0
	for i, p := range d.Panels {
		w, h := p.W, p.H
		if w == 0 {
			w = 12
		}
		if h == 0 {
			h = 8
		}
		if p.Type == "row" {
			w, h = 24, 1
		}
		if x+w > 24 || p.Type == "row" {
			if x > 0 {
				y += rowH
			}
			x, rowH = 0, 0
		}
		pos := map[string]int{"x": x, "y": y, "w": w, "h": h}
		x += w
		rowH = max(rowH, h)
		if p.Type == "row" {
			panels = append(panels, map[string]any{"id": i + 1, "type": "row", "title": p.Title, "collapsed": false,
				"gridPos": pos, "panels": []any{}})
			y, x, rowH = y+1, 0, 0
			continue
		}
		var targets []any
		for j, t := range p.Targets {
			targets = append(targets, map[string]any{"refId": string(rune('A' + j)), "datasource": ds, "expr": t.Expr,
				"legendFormat": t.Legend, "range": true, "instant": false})
		}
		base := p.Base
		if base == "" {
			base = "green"
		}
		steps := []any{map[string]any{"color": base, "value": nil}}
		for _, s := range p.Thresholds {
			steps = append(steps, map[string]any{"color": s.Color, "value": s.Value})
		}
		defaults := map[string]any{"unit": p.Unit, "thresholds": map[string]any{"mode": "absolute", "steps": steps}}
		if p.Mappings != nil {
			defaults["mappings"] = p.Mappings
		} else {
			defaults["mappings"] = []any{}
		}
		var options map[string]any
		switch p.Type {
		case "stat":
			defaults["color"] = map[string]any{"mode": "thresholds"}
			text := "value"
			if p.TextName {
				text = "name"
			}
			options = map[string]any{"reduceOptions": map[string]any{"calcs": []string{"lastNotNull"}, "fields": "", "values": false},
				"colorMode": "background", "graphMode": "none", "textMode": text, "justifyMode": "auto", "orientation": "auto"}
		case "timeseries":
			defaults["color"] = map[string]any{"mode": "palette-classic"}
			defaults["custom"] = map[string]any{"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never",
				"thresholdsStyle": map[string]any{"mode": "dashed"}}
			options = map[string]any{"legend": map[string]any{"displayMode": "list", "placement": "bottom", "showLegend": true},
				"tooltip": map[string]any{"mode": "multi", "sort": "desc"}}
		default:
			return nil, fmt.Errorf("panel %q: unknown type %q", p.Title, p.Type)
		}
		panels = append(panels, map[string]any{"id": i + 1, "type": p.Type, "title": p.Title, "description": p.Description,
			"datasource": ds, "gridPos": pos, "targets": targets, "options": options,
			"fieldConfig": map[string]any{"defaults": defaults, "overrides": []any{}}})
	}
	vars := []any{
		map[string]any{"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
			"current": map[string]any{}, "hide": 0, "refresh": 1, "regex": "", "options": []any{}},
		map[string]any{"name": "changefeed", "label": "Changefeed", "type": "query", "datasource": ds,
			"query":      map[string]any{"query": "label_values(parity_cdc_applier_state, changefeed)", "refId": "changefeed"},
			"definition": "label_values(parity_cdc_applier_state, changefeed)",
			"current":    map[string]any{}, "hide": 0, "refresh": 2, "multi": true, "includeAll": true, "allValue": ".*",
			"sort": 1, "regex": "", "options": []any{}},
	}
	if d.Fleet {
		vars = append(vars, map[string]any{"name": "member", "label": "Member", "type": "query", "datasource": ds,
			"query":      map[string]any{"query": "label_values(parity_cdc_applier_state, member)", "refId": "member"},
			"definition": "label_values(parity_cdc_applier_state, member)",
			"current":    map[string]any{}, "hide": 0, "refresh": 2, "multi": true, "includeAll": true, "allValue": ".*",
			"sort": 1, "regex": "", "options": []any{}})
	}
	out := map[string]any{
		"uid": d.UID, "title": d.Title, "description": d.Description, "tags": []string{"parity"},
		"schemaVersion": SchemaVersion, "version": 1, "editable": true, "graphTooltip": 1,
		"time": map[string]string{"from": "now-1h", "to": "now"}, "refresh": "30s", "timezone": "",
		"annotations": map[string]any{"list": []any{}}, "links": []any{},
		"templating": map[string]any{"list": vars},
		"panels":     panels,
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Files returns the dashboards as JSON, by file name.
func Files() (map[string][]byte, error) {
	out := map[string][]byte{}
	for name, d := range map[string]Dashboard{"replication.json": replication(), "verification.json": verification(), "cutover.json": cutover(),
		"fleet.json": fleet()} {
		b, err := d.json()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out[name] = b
	}
	return out, nil
}

func row(title string) Panel { return Panel{Type: "row", Title: title} }

func q(expr, legend string) Target { return Target{Expr: expr, Legend: legend} }

var (
	lagSteps       = []Step{{60, "yellow"}, {300, "red"}}
	freshnessSteps = []Step{{3600, "yellow"}, {7200, "red"}}
	viewAgeSteps   = []Step{{600, "yellow"}, {900, "red"}}
	anyIsBad       = []Step{{1, "red"}}
	rowsPerSecond  = "suffix: rows/s"
)

func lagStat() Panel {
	return Panel{Type: "stat", Title: "Applied checkpoint lag", W: 6, H: 5, Unit: "s", Thresholds: lagSteps,
		Description: "Wall clock minus the physical time of the applied checkpoint: the fallback holds TiDB's data as of this long ago. Alert ParityCheckpointLagHigh at 5 minutes.",
		Targets:     []Target{q(`parity_cdc_checkpoint_lag_seconds{`+cf+`}`, "{{changefeed}}")}}
}

func stateStat() Panel {
	return Panel{Type: "stat", Title: "Applier running", W: 6, H: 5, Unit: "none", Base: "red", Thresholds: []Step{{1, "green"}},
		Mappings: []map[string]any{{"type": "value", "options": map[string]any{
			"0": map[string]any{"text": "NOT RUNNING", "color": "red", "index": 0}, "1": map[string]any{"text": "RUNNING", "color": "green", "index": 1}}}},
		Description: "Whether the replicator runs (parity_cdc_applier_state has its state: starting, running, stopped, failed). Alert ParityApplierStopped when stopped or failed.",
		Targets:     []Target{q(`parity_cdc_applier_state{`+cf+`, state="running"}`, "{{changefeed}}")}}
}

func freshnessStat() Panel {
	return Panel{Type: "stat", Title: "Verification freshness", W: 6, H: 5, Unit: "s", Thresholds: freshnessSteps,
		Description: "Age of the oldest applied change no clean full verification covers yet (an upper bound; +Inf before any clean run). Alert ParityVerificationStale at 2 hours.",
		Targets:     []Target{q(`parity_verify_freshness_seconds{`+cf+`}`, "{{changefeed}}")}}
}

func lagSeries() Panel {
	return Panel{Type: "timeseries", Title: "Checkpoint and resolved lag", Unit: "s", Thresholds: lagSteps,
		Description: "Applied checkpoint lag (what the fallback holds) and resolved lag (what TiCDC has delivered through Kafka). Resolved lag as large as the checkpoint lag means TiCDC or Kafka is behind, not parity.",
		Targets: []Target{q(`parity_cdc_checkpoint_lag_seconds{`+cf+`}`, "{{changefeed}} applied"),
			q(`parity_cdc_resolved_lag_seconds{`+cf+`}`, "{{changefeed}} resolved")}}
}

func replication() Dashboard {
	return Dashboard{UID: "parity-replication", Title: "parity / Replication",
		Description: "parity serve applying a TiCDC open-protocol changefeed from Kafka to the fallback MySQL: lags, throughput, buffers, errors.",
		Panels: []Panel{
			row("Lag"),
			lagStat(),
			{Type: "stat", Title: "Resolved lag", W: 6, H: 5, Unit: "s", Thresholds: lagSteps,
				Description: "Wall clock minus the physical time of the global resolved ts (the minimum over the changefeed's partitions): how far behind TiCDC's delivery is.",
				Targets:     []Target{q(`parity_cdc_resolved_lag_seconds{`+cf+`}`, "{{changefeed}}")}},
			stateStat(),
			{Type: "stat", Title: "Kafka records not yet read", W: 6, H: 5, Unit: "short", Thresholds: []Step{{10000, "yellow"}, {100000, "red"}},
				Description: "Sum over the changefeed's partitions of the high watermark minus the next offset parity reads.",
				Targets:     []Target{q(`sum by (changefeed) (parity_cdc_kafka_lag_messages{`+cf+`})`, "{{changefeed}}")}},
			lagSeries(),
			{Type: "timeseries", Title: "Kafka lag per partition", Unit: "short", Thresholds: []Step{{10000, "yellow"}, {100000, "red"}},
				Description: "Records of each partition not yet read (high watermark minus next offset). One partition far above the others points at a hot key or a stuck reader.",
				Targets:     []Target{q(`parity_cdc_kafka_lag_messages{`+cf+`}`, "{{changefeed}} {{topic}}/{{partition}}")}},
			{Type: "timeseries", Title: "Resolved ts lag per partition", Unit: "s", Thresholds: lagSteps,
				Description: "Wall clock minus each partition's resolved ts. Rows are applied only once every partition's resolved ts passed them: the slowest partition holds the whole changefeed back.",
				Targets:     []Target{q(`time() - parity_cdc_partition_resolved_ts_seconds{`+cf+`}`, "{{changefeed}} {{topic}}/{{partition}}")}},
			row("Throughput"),
			{Type: "timeseries", Title: "Rows applied by type", Unit: rowsPerSecond, Thresholds: []Step{},
				Description: "Row events applied to the fallback per second, by type (insert, update, delete).",
				Targets:     []Target{q(`sum by (changefeed, type) (rate(parity_cdc_applied_rows_total{`+cf+`}[$__rate_interval]))`, "{{changefeed}} {{type}}")}},
			{Type: "timeseries", Title: "Apply round duration", Unit: "s", Thresholds: []Step{{1, "yellow"}, {10, "red"}},
				Description: "p50 and p99 of one apply round: the rows up to a resolved ts (and the DDLs due) written and the checkpoint recorded.",
				Targets: []Target{
					q(`histogram_quantile(0.5, sum by (changefeed, le) (rate(parity_cdc_apply_round_duration_seconds_bucket{`+cf+`}[$__rate_interval])))`, "{{changefeed}} p50"),
					q(`histogram_quantile(0.99, sum by (changefeed, le) (rate(parity_cdc_apply_round_duration_seconds_bucket{`+cf+`}[$__rate_interval])))`, "{{changefeed}} p99")}},
			{Type: "timeseries", Title: "DDLs and upstream row reads", Unit: "short", Thresholds: []Step{},
				Description: "DDLs applied (or recorded as skipped) and handle-key-only row events completed by reading TiDB, per rate interval.",
				Targets: []Target{q(`sum by (changefeed) (increase(parity_cdc_applied_ddls_total{`+cf+`}[$__rate_interval]))`, "{{changefeed}} DDLs"),
					q(`sum by (changefeed) (increase(parity_cdc_upstream_rows_fetched_total{`+cf+`}[$__rate_interval]))`, "{{changefeed}} rows read from TiDB")}},
			{Type: "timeseries", Title: "Apply rounds per second", Unit: "ops", Thresholds: []Step{},
				Description: "Apply rounds (checkpoints recorded) per second: each round covers one or more resolved ts.",
				Targets:     []Target{q(`sum by (changefeed) (rate(parity_cdc_apply_round_duration_seconds_count{`+cf+`}[$__rate_interval]))`, "{{changefeed}}")}},
			row("Buffers"),
			{Type: "timeseries", Title: "Buffered and spilled rows", Unit: "short", Thresholds: []Step{},
				Description: "Row events waiting for the resolved ts (all of them, and those spilled to disk because applier.memory-bytes was reached), and DDLs received but not yet applied.",
				Targets: []Target{q(`parity_cdc_buffered_rows{`+cf+`}`, "{{changefeed}} buffered"), q(`parity_cdc_spilled_rows{`+cf+`}`, "{{changefeed}} spilled"),
					q(`parity_cdc_pending_ddls{`+cf+`}`, "{{changefeed}} pending DDLs")}},
			{Type: "timeseries", Title: "Buffered memory", Unit: "bytes", Thresholds: []Step{},
				Description: "Approximate memory held by buffered row events (bounded by applier.memory-bytes; the rest spills).",
				Targets:     []Target{q(`parity_cdc_buffered_bytes{`+cf+`}`, "{{changefeed}}")}},
			row("Errors"),
			{Type: "timeseries", Title: "Retries", Unit: "short", Thresholds: []Step{{1, "yellow"}},
				Description: "Transient errors retried per rate interval: downstream (the applier's statements: lock waits, deadlocks, lost connections) and upstream (row reads from TiDB).",
				Targets:     []Target{q(`sum by (changefeed, target) (increase(parity_cdc_retries_total{`+cf+`}[$__rate_interval]))`, "{{changefeed}} {{target}}")}},
			{Type: "stat", Title: "Decode errors since start", W: 6, H: 8, Unit: "short", Thresholds: anyIsBad,
				Description: "Kafka records that could not be decoded since parity started. Each stops its partition (and the applier), or is dead-lettered with applier.dead-letter.",
				Targets:     []Target{q(`parity_cdc_decode_errors_total{`+cf+`}`, "{{changefeed}}")}},
			{Type: "stat", Title: "Dead letters since start", W: 6, H: 8, Unit: "short", Thresholds: anyIsBad,
				Description: "Records copied to the meta schema's dead_letter table since parity started: their changes are not in the fallback. Alert ParityDeadLetters.",
				Targets:     []Target{q(`parity_cdc_dead_letters_total{`+cf+`}`, "{{changefeed}}")}},
			row("Bypass detection"),
			{Type: "timeseries", Title: "Bypass detector lag", Unit: "s", Thresholds: []Step{{30, "yellow"}, {60, "red"}},
				Description: "How long ago the bypass detector ([bypass]) last had read the fallback's binlog to its end: it grows with the time while the detector cannot read (reconnecting) and while it falls behind; writes straight into the fallback are detected only once read. Under [ha] only the active daemon reads and has it. Alert ParityBypassDetectorBehind at 1 minute for 2 minutes.",
				Targets:     []Target{q(`parity_bypass_lag_seconds{`+cf+`}`, "{{changefeed}} {{instance}}")}},
		}}
}

func verification() Dashboard {
	return Dashboard{UID: "parity-verification", Title: "parity / Verification",
		Description: "parity serve's verification at snapshot pairs: freshness next to lag, runs and their results, differences by class, chunk latency, the applier's pause per pair.",
		Panels: []Panel{
			row("Freshness"),
			freshnessStat(),
			lagStat(),
			{Type: "stat", Title: "Running runs", W: 6, H: 5, Unit: "short", Thresholds: []Step{},
				Description: "Verification runs started and not ended, including those waiting for a slot (verify.max-concurrent-runs).",
				Targets:     []Target{q(`parity_verify_running_runs{`+cf+`}`, "{{changefeed}}")}},
			{Type: "stat", Title: "Snapshot read view age", W: 6, H: 5, Unit: "s", Thresholds: viewAgeSteps,
				Description: "Age of the oldest snapshot pair open now (0 when none): TiDB's GC and the fallback's purge are held back while it is open. Alert ParitySnapshotReadViewTooOld at 15 minutes.",
				Targets:     []Target{q(`parity_verify_pair_read_view_age_seconds{`+cf+`}`, "{{changefeed}}")}},
			{Type: "timeseries", Title: "Freshness and lag", Unit: "s", Thresholds: freshnessSteps,
				Description: "Verification freshness (how old the oldest applied change no clean verification covers is) next to the applied checkpoint lag: freshness grows between clean runs and drops when one ends.",
				Targets: []Target{q(`parity_verify_freshness_seconds{`+cf+`}`, "{{changefeed}} freshness"),
					q(`parity_cdc_checkpoint_lag_seconds{`+cf+`}`, "{{changefeed}} applied lag")}},
			{Type: "timeseries", Title: "Time since last clean full verification", Unit: "s", Thresholds: []Step{{86400, "yellow"}, {172800, "red"}},
				Description: "Time since the newest clean full (or cdc-scoped) verification over verify.tables ended; it survives restarts (read from the history).",
				Targets:     []Target{q(`time() - parity_verify_last_clean_run_end_timestamp_seconds{`+cf+`} > 0`, "{{changefeed}}")}},
			row("Runs"),
			{Type: "timeseries", Title: "Runs by trigger and result", Unit: "short", Thresholds: []Step{},
				Description: "Runs ended per rate interval, by trigger (schedule name, continuous, manual, cutover-check) and result (equal, different, failed, cancelled, skipped).",
				Targets:     []Target{q(`sum by (changefeed, trigger, result) (increase(parity_verify_runs_total{`+cf+`}[$__rate_interval]))`, "{{changefeed}} {{trigger}} {{result}}")}},
			{Type: "stat", Title: "Last result per trigger", Unit: "none", TextName: true, Thresholds: []Step{},
				Description: "How the newest run of each trigger ended since the daemon started. Alerts ParityDifferencesFound (schedule, continuous) and ParityScheduledVerificationFailed.",
				Targets:     []Target{q(`parity_verify_last_run_result{`+cf+`} == 1`, "{{trigger}}: {{result}}")}},
			{Type: "timeseries", Title: "Time since each trigger's last run", Unit: "s", Thresholds: []Step{},
				Description: "Time since the newest run of each trigger ended.",
				Targets:     []Target{q(`time() - parity_verify_last_run_end_timestamp_seconds{`+cf+`}`, "{{changefeed}} {{trigger}}")}},
			{Type: "timeseries", Title: "Next scheduled firing", Unit: "s", Thresholds: []Step{},
				Description: "Seconds until each schedule should fire next; below -600 the firing was missed (alert ParityScheduledVerificationMissed).",
				Targets:     []Target{q(`parity_verify_schedule_next_run_timestamp_seconds{`+cf+`} - time()`, "{{changefeed}} {{trigger}}")}},
			row("Differences"),
			{Type: "timeseries", Title: "Differences by class", Unit: "short", Thresholds: []Step{{1, "red"}},
				Description: "Differing rows found per rate interval, by class: bypass (a write straight into the fallback), imported (the import), post-import (while the applier caught up), cdc (during live replication), diverged, unclassified.",
				Targets:     []Target{q(`sum by (changefeed, class) (increase(parity_verify_differences_total{`+cf+`}[$__rate_interval]))`, "{{changefeed}} {{class}}")}},
			{Type: "timeseries", Title: "Differences by kind", Unit: "short", Thresholds: []Step{{1, "red"}},
				Description: "Differing rows found per rate interval, by kind: missing (only in TiDB), extra (only in the fallback), differing (values), unlisted (beyond the report's listed rows).",
				Targets:     []Target{q(`sum by (changefeed, kind) (increase(parity_verify_differences_total{`+cf+`}[$__rate_interval]))`, "{{changefeed}} {{kind}}")}},
			{Type: "timeseries", Title: "Unconfirmed at the same pair", Unit: "short", Thresholds: []Step{{1, "yellow"}},
				Description: "Rows found different at a snapshot pair and equal when read again at the same pair, per rate interval: a snapshot read that was not repeatable (a store anomaly, not reported as differences). Alert ParitySnapshotReadNotRepeatable.",
				Targets:     []Target{q(`sum by (changefeed) (increase(parity_verify_unconfirmed_differences_total{`+cf+`}[$__rate_interval]))`, "{{changefeed}}")}},
			row("Work"),
			{Type: "timeseries", Title: "Rows compared", Unit: rowsPerSecond, Thresholds: []Step{},
				Description: "Upstream rows compared per second by verification runs (bounded by verify.max-rows-per-second).",
				Targets:     []Target{q(`sum by (changefeed) (rate(parity_verify_rows_checked_total{`+cf+`}[$__rate_interval]))`, "{{changefeed}}")}},
			{Type: "timeseries", Title: "Chunks by result", Unit: "ops", Thresholds: []Step{},
				Description: "Chunk comparisons per second by result: equal, different (checksums differ, drilled down), failed (an attempt that failed; retried up to twice).",
				Targets:     []Target{q(`sum by (changefeed, result) (rate(parity_verify_chunks_total{`+cf+`}[$__rate_interval]))`, "{{changefeed}} {{result}}")}},
			{Type: "timeseries", Title: "Chunk latency", Unit: "s", Thresholds: []Step{{5, "yellow"}, {30, "red"}},
				Description: "p50 and p99 of one chunk comparison (both sides' checksums, and the drill-down when they differ).",
				Targets: []Target{
					q(`histogram_quantile(0.5, sum by (changefeed, le) (rate(parity_verify_chunk_duration_seconds_bucket{`+cf+`}[$__rate_interval])))`, "{{changefeed}} p50"),
					q(`histogram_quantile(0.99, sum by (changefeed, le) (rate(parity_verify_chunk_duration_seconds_bucket{`+cf+`}[$__rate_interval])))`, "{{changefeed}} p99")}},
			{Type: "timeseries", Title: "Throttled share", Unit: "percentunit", Thresholds: []Step{{0.5, "yellow"}},
				Description: "Share of time runs waited for the applier's lag to fall within verify.max-lag before opening pairs.",
				Targets:     []Target{q(`sum by (changefeed) (rate(parity_verify_throttled_seconds_total{`+cf+`}[$__rate_interval]))`, "{{changefeed}}")}},
			row("Snapshot pairs"),
			{Type: "timeseries", Title: "Applier pause per pair", Unit: "s", Thresholds: []Step{{0.1, "yellow"}, {1, "red"}},
				Description: "p50 and p99 of how long replication waited for each snapshot pair (the applier's barrier while both read views open).",
				Targets: []Target{
					q(`histogram_quantile(0.5, sum by (changefeed, le) (rate(parity_verify_pause_seconds_bucket{`+cf+`}[$__rate_interval])))`, "{{changefeed}} p50"),
					q(`histogram_quantile(0.99, sum by (changefeed, le) (rate(parity_verify_pause_seconds_bucket{`+cf+`}[$__rate_interval])))`, "{{changefeed}} p99")}},
			{Type: "timeseries", Title: "Pairs, rotations and passed barriers", Unit: "short", Thresholds: []Step{},
				Description: "Per rate interval: snapshot pairs opened; pairs replaced because their view reached verify.max-view-age; pair TSOs the applier had already applied beyond (tried again at a newer TSO).",
				Targets: []Target{q(`sum by (changefeed) (increase(parity_verify_pairs_total{`+cf+`}[$__rate_interval]))`, "{{changefeed}} pairs"),
					q(`sum by (changefeed) (increase(parity_verify_view_rotations_total{`+cf+`}[$__rate_interval]))`, "{{changefeed}} rotations"),
					q(`sum by (changefeed) (increase(parity_verify_barrier_passed_total{`+cf+`}[$__rate_interval]))`, "{{changefeed}} passed")}},
		}}
}

func cutover() Dashboard {
	return Dashboard{UID: "parity-cutover", Title: "parity / Cutover",
		Description: "One screen for the cutover window: applied vs upstream ts, lag, the last snapshot pair, the last clean full verification and the last cutover-check.",
		Panels: []Panel{
			lagStat(),
			freshnessStat(),
			{Type: "stat", Title: "Last cutover-check", W: 6, H: 5, Unit: "none", Base: "red", Thresholds: []Step{{1, "green"}},
				Mappings: []map[string]any{{"type": "value", "options": map[string]any{
					"0": map[string]any{"text": "NOT EQUAL", "color": "red", "index": 0}, "1": map[string]any{"text": "EQUAL", "color": "green", "index": 1}}}},
				Description: "Result of the newest cutover-check (a verification run with trigger cutover-check) since the daemon started: EQUAL when it proved both sides equal at a snapshot pair; anything else (different, failed, cancelled) shows NOT EQUAL.",
				Targets:     []Target{q(`sum by (changefeed) (parity_verify_last_run_result{`+cf+`, trigger="cutover-check", result="equal"})`, "{{changefeed}}")}},
			{Type: "stat", Title: "Last cutover-check age", W: 6, H: 5, Unit: "s", Thresholds: []Step{{900, "yellow"}, {3600, "red"}},
				Description: "Time since the newest cutover-check ended: an old pass says little about now.",
				Targets:     []Target{q(`time() - parity_verify_last_run_end_timestamp_seconds{`+cf+`, trigger="cutover-check"}`, "{{changefeed}}")}},
			{Type: "timeseries", Title: "Applied vs upstream ts", Unit: "dateTimeAsIso", Thresholds: []Step{},
				Description: "Physical time of the applied checkpoint (what the fallback holds) and of the global resolved ts (what TiCDC delivered), next to now: the lines meet when the fallback is caught up.",
				Targets: []Target{q(`parity_cdc_checkpoint_ts_seconds{`+cf+`} * 1000`, "{{changefeed}} applied"),
					q(`parity_cdc_resolved_ts_seconds{`+cf+`} * 1000`, "{{changefeed}} resolved")}},
			lagSeries(),
			stateStat(),
			{Type: "stat", Title: "Last snapshot pair", W: 6, H: 5, Unit: "dateTimeAsIso", Thresholds: []Step{},
				Description: "Physical time of the newest snapshot pair's TSO (an open pair's, or the newest ended run's last pair): where both sides were last read at one point.",
				Targets:     []Target{q(`parity_verify_last_pair_ts_seconds{`+cf+`} * 1000 > 0`, "{{changefeed}}")}},
			{Type: "stat", Title: "Last clean full verification age", W: 6, H: 5, Unit: "s", Thresholds: []Step{{3600, "yellow"}, {86400, "red"}},
				Description: "Time since the newest clean full (or cdc-scoped) verification over verify.tables ended (read from the history at start).",
				Targets:     []Target{q(`time() - parity_verify_last_clean_run_end_timestamp_seconds{`+cf+`} > 0`, "{{changefeed}}")}},
			{Type: "stat", Title: "Differences found in the window", W: 6, H: 5, Unit: "short", Thresholds: anyIsBad,
				Description: "Differing rows found by verification runs over the dashboard's time range.",
				Targets:     []Target{q(`sum by (changefeed) (increase(parity_verify_differences_total{`+cf+`}[$__range]))`, "{{changefeed}}")}},
			{Type: "stat", Title: "Kafka records not yet read", W: 6, H: 5, Unit: "short", Thresholds: []Step{{10000, "yellow"}, {100000, "red"}},
				Description: "Sum over the changefeed's partitions of the high watermark minus the next offset parity reads: 0 once everything TiCDC wrote was read.",
				Targets:     []Target{q(`sum by (changefeed) (parity_cdc_kafka_lag_messages{`+cf+`})`, "{{changefeed}}")}},
		}}
}

// The fleet: one parity serve per fallback server (a member), each scraped with the
// member label (deploy/prometheus/prometheus-fleet.yml), a member's standby daemons
// under the same label. Every fleet query selects $changefeed and $member, aggregates
// by member, and leaves out standing-by daemons (their applier_state is standby: they
// apply nothing, and their lag is not the member's).

// fm is the fleet selector every fleet query carries.
const fm = cf + `, member=~"$member"`

// activeOnly keeps the series of daemons that are not standing by.
func activeOnly(expr string) string {
	return `(` + expr + `) unless on (member, instance, changefeed) (parity_cdc_applier_state{` + fm + `, state="standby"} == 1)`
}

// perMember is the worst (largest) value of a metric per member, standbys left out.
func perMember(metric string) string {
	return `max by (member) (` + activeOnly(metric+`{`+fm+`}`) + `)`
}

// lastResultEqual is 1 per member when its daemon's newest verification run (of any
// trigger) ended equal, 0 when it ended otherwise (different, failed, cancelled,
// skipped); absent before a run ended since the daemon started.
func lastResultEqual() string {
	newest := `parity_verify_last_run_end_timestamp_seconds{` + fm + `} == on (member, changefeed) group_left max by (member, changefeed) (parity_verify_last_run_end_timestamp_seconds{` + fm + `})`
	return `max by (member) (` + activeOnly(`parity_verify_last_run_result{`+fm+`, result="equal"} and on (member, instance, changefeed, trigger) (`+newest+`)`) + `)`
}

var equalMapping = []map[string]any{{"type": "value", "options": map[string]any{
	"0": map[string]any{"text": "NOT EQUAL", "color": "red", "index": 0}, "1": map[string]any{"text": "EQUAL", "color": "green", "index": 1}}}}

func fleet() Dashboard {
	return Dashboard{UID: "parity-fleet", Title: "parity / Fleet", Fleet: true,
		Description: "A fleet of fallbacks: one parity serve per fallback server (a member, Prometheus' member label), one line per member for lag, freshness and the last verification result; the fleet's lag is the worst member's.",
		Panels: []Panel{
			row("Fleet"),
			{Type: "stat", Title: "Fleet lag (worst member)", W: 6, H: 5, Unit: "s", Thresholds: lagSteps,
				Description: "The largest applied checkpoint lag over the members: the fleet holds TiDB's data as of this long ago at best. Alert ParityFleetMemberBehind names the member past 5 minutes.",
				Targets:     []Target{q(`max(`+perMember("parity_cdc_checkpoint_lag_seconds")+`)`, "fleet")}},
			{Type: "stat", Title: "Fleet freshness (worst member)", W: 6, H: 5, Unit: "s", Thresholds: freshnessSteps,
				Description: "The largest verification freshness over the members: the oldest applied change no clean full verification covers, anywhere in the fleet (+Inf while a member has no clean run). Alert ParityFleetMemberBehind names the member past 2 hours.",
				Targets:     []Target{q(`max(`+perMember("parity_verify_freshness_seconds")+`)`, "fleet")}},
			{Type: "stat", Title: "Members applying", W: 6, H: 5, Unit: "short", Thresholds: []Step{},
				Description: "Members whose daemon reports its applier running (a member's standby is not counted). Compare with the number of fallbacks: a missing member is a fallback nobody follows.",
				Targets:     []Target{q(`count(max by (member) (parity_cdc_applier_state{`+fm+`, state="running"}) == 1) or vector(0)`, "running")}},
			{Type: "stat", Title: "Members not verified equal", W: 6, H: 5, Unit: "short", Thresholds: anyIsBad,
				Description: "Members whose newest verification run did not end equal (different, failed, cancelled or skipped). A cutover needs every member equal at one TSO: parity fleet cutover-check.",
				Targets:     []Target{q(`count(`+lastResultEqual()+` == 0) or vector(0)`, "not equal")}},
			row("Per member"),
			{Type: "timeseries", Title: "Applied checkpoint lag per member", Unit: "s", Thresholds: lagSteps,
				Description: "Wall clock minus the physical time of each member's applied checkpoint: what its fallback holds. One member far above the others is that fallback (its writes, its disk) or its topics behind.",
				Targets:     []Target{q(perMember("parity_cdc_checkpoint_lag_seconds"), "{{member}}")}},
			{Type: "timeseries", Title: "Resolved lag per member", Unit: "s", Thresholds: lagSteps,
				Description: "Wall clock minus each member's global resolved ts: how far behind TiCDC's delivery of that member's topics is. As large as the member's applied lag means TiCDC or Kafka is behind, not parity.",
				Targets:     []Target{q(perMember("parity_cdc_resolved_lag_seconds"), "{{member}}")}},
			{Type: "timeseries", Title: "Verification freshness per member", Unit: "s", Thresholds: freshnessSteps,
				Description: "Each member's verification freshness: the age of its oldest applied change no clean full verification covers (+Inf before its first clean run).",
				Targets:     []Target{q(perMember("parity_verify_freshness_seconds"), "{{member}}")}},
			{Type: "timeseries", Title: "Last verification result per member", Unit: "none", Base: "red", Thresholds: []Step{{1, "green"}},
				Mappings:    equalMapping,
				Description: "1 while a member's newest verification run (any trigger) ended equal, 0 while it ended different, failed, cancelled or skipped; no line before a run ended since its daemon started.",
				Targets:     []Target{q(lastResultEqual(), "{{member}}")}},
			{Type: "stat", Title: "Last verification result", W: 24, H: 5, Unit: "none", Base: "red", Thresholds: []Step{{1, "green"}},
				Mappings:    equalMapping,
				Description: "One tile per member: EQUAL when its newest verification run ended equal, NOT EQUAL otherwise.",
				Targets:     []Target{q(lastResultEqual(), "{{member}}")}},
			{Type: "timeseries", Title: "Kafka records not yet read per member", Unit: "short", Thresholds: []Step{{10000, "yellow"}, {100000, "red"}},
				Description: "Records of each member's topics not yet read (sum over its partitions of the high watermark minus the next offset).",
				Targets:     []Target{q(`sum by (member) (`+activeOnly(`parity_cdc_kafka_lag_messages{`+fm+`}`)+`)`, "{{member}}")}},
			{Type: "timeseries", Title: "Rows applied per member", Unit: rowsPerSecond, Thresholds: []Step{},
				Description: "Row events applied to each member's fallback per second (all types).",
				Targets:     []Target{q(`sum by (member) (rate(parity_cdc_applied_rows_total{`+fm+`}[$__rate_interval]))`, "{{member}}")}},
			{Type: "timeseries", Title: "Differences found per member", Unit: "short", Thresholds: []Step{{1, "red"}},
				Description: "Differing rows found by each member's verification runs per rate interval (all kinds and classes; the member's Verification dashboard has them by class).",
				Targets:     []Target{q(`sum by (member) (increase(parity_verify_differences_total{`+fm+`}[$__rate_interval]))`, "{{member}}")}},
		}}
}

// Query is one panel query of a committed dashboard.
type Query struct {
	File, Panel, Expr string
}

// Queries reads the dashboards' JSON files in dir and returns every panel query, as
// committed (what Grafana runs).
func Queries(dir string) ([]Query, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	var out []Query
	for _, name := range names {
		raw, err := os.ReadFile(name)
		if err != nil {
			return nil, err
		}
		var d struct {
			Panels []struct {
				Title   string `json:"title"`
				Targets []struct {
					Expr string `json:"expr"`
				} `json:"targets"`
			} `json:"panels"`
		}
		if err := json.Unmarshal(raw, &d); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		for _, p := range d.Panels {
			for _, t := range p.Targets {
				out = append(out, Query{File: filepath.Base(name), Panel: p.Title, Expr: t.Expr})
			}
		}
	}
	return out, nil
}
