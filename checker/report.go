package checker

// report.go owns what a run hands back: the Report, its report.json and the fix SQL
// files (written by the tracker from what it counted and the store holds), and the
// Progress and Stats a caller reads while the run goes on. It must not query the compared
// servers.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Report is the result of a run. A data difference is a result, not an error.
type Report struct {
	RunID      string    `json:"run_id"`
	State      string    `json:"state"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
	Upstream   string    `json:"upstream"`
	Downstream string    `json:"downstream"`
	// UpstreamSnapshot and DownstreamSnapshot name the points the sides were read at, when
	// set (a TiDB TSO or datetime, or the label of a snapshot source, connSourceConfig):
	// "equal" holds between those points.
	UpstreamSnapshot   string `json:"upstream_snapshot,omitempty"`
	DownstreamSnapshot string `json:"downstream_snapshot,omitempty"`
	// RecheckRounds counts the rounds in which the rows of the differences were read
	// again (Config.RecheckRounds; none when both sides were read at a snapshot).
	RecheckRounds int           `json:"recheck_rounds,omitempty"`
	Equal         bool          `json:"equal"`
	Tables        []TableReport `json:"tables"`
	// Scope is the run's scope (Config.Scope): full, cdc or since:<TSO>.
	Scope string `json:"scope,omitempty"`
	// DifferencesByClass counts the differing rows of every table by class (classify.go);
	// "in-flight" counts the rows the re-check resolved (not in DifferencesTotal).
	DifferencesByClass map[string]int64 `json:"differences_by_class,omitempty"`
	// Classification says how the differences were classified (absent when none were).
	Classification *Classification `json:"classification,omitempty"`
}

// TableReport is the result for one table pair.
type TableReport struct {
	Schema           string `json:"schema"`
	Table            string `json:"table"`
	DownstreamSchema string `json:"downstream_schema"`
	DownstreamTable  string `json:"downstream_table"`
	// StructureEqual is false when columns, types or keys differ; StructureProblems says
	// how. A fatal problem (e.g. the table or its key is missing downstream) means the
	// data was not compared (DataCompared false).
	StructureEqual    bool               `json:"structure_equal"`
	StructureProblems []StructureProblem `json:"structure_problems,omitempty"`
	DataCompared      bool               `json:"data_compared"`
	Key               []string           `json:"key,omitempty"`
	Keyless           bool               `json:"keyless,omitempty"`
	// RowsChecked counts upstream rows compared; DownstreamRows the downstream ones.
	RowsChecked    int64 `json:"rows_checked"`
	DownstreamRows int64 `json:"downstream_rows"`
	Chunks         int   `json:"chunks"`
	// DifferencesTotal counts every differing row (a keyless difference with Count n
	// counts n); Differences lists them in key order up
	// to Config.MaxReportedDifferences (DifferencesTruncated says the list is cut).
	DifferencesTotal     int64        `json:"differences_total"`
	Differences          []Difference `json:"differences"`
	DifferencesTruncated bool         `json:"differences_truncated,omitempty"`
	// UndrilledChunks counts chunks whose checksums differ but whose rows were not
	// compared, because Config.MaxDifferences rows of the table were already found to
	// differ: their rows are not in DifferencesTotal, Differences or the fix SQL.
	UndrilledChunks int `json:"undrilled_chunks,omitempty"`
	// DifferencesResolved counts the rows found different and then equal when the
	// re-check read them again (replication in flight): they are not in
	// DifferencesTotal, Differences or the fix SQL.
	DifferencesResolved int64 `json:"differences_resolved,omitempty"`
	// DifferencesUnconfirmed counts the rows found different at a snapshot pair and
	// equal when the confirmation read them again at the same pair (recheck.go): a
	// snapshot read that was not repeatable, so not a difference of the data. They are
	// not in DifferencesTotal, Differences, DifferencesByClass or the fix SQL.
	DifferencesUnconfirmed int64 `json:"differences_unconfirmed,omitempty"`
	// FixSQLFile is the fix SQL file, relative to the output directory.
	FixSQLFile string `json:"fix_sql_file,omitempty"`
	// Scope is what the run compared of the table: "full" (every row, a full run),
	// "keys" (the keys the changefeed changed in (ScopeFromTs, ScopeUntilTs], ScopeKeys
	// of them, read by key on both sides) or "whole" (every row, in a scoped run:
	// ScopeNote says why, e.g. a keyless table).
	Scope        string `json:"scope,omitempty"`
	ScopeNote    string `json:"scope_note,omitempty"`
	ScopeFromTs  uint64 `json:"scope_from_ts,omitempty"`
	ScopeUntilTs uint64 `json:"scope_until_ts,omitempty"`
	ScopeKeys    int64  `json:"scope_keys,omitempty"`
	// BypassReport: for a table compared by keys, whether the writes that bypassed
	// parity are among them (bypasskeys.go).
	BypassReport
	// DifferencesByClass counts the table's differing rows by class, and "in-flight" its
	// DifferencesResolved.
	DifferencesByClass map[string]int64 `json:"differences_by_class,omitempty"`
}

// BypassReport says, for a table compared by keys, whether the keys of writes that
// bypassed parity are among them: Bypass "included" (the bypass detector watched the
// whole window; BypassKeys of the keys came from its records only), "unwatched" (part of
// the window was not watched, or the detector could not vouch for it: BypassNote says
// which part and why; the detections that exist are included) or "off" (no detector:
// only the changefeed's keys). BypassDDL lists the DDL statements made straight in the
// fallback on the table in the window (the table is then compared whole). BypassSince is
// where the window's bypass writes were read from, BypassWatched where the detector's
// current stretch of watching began. The same value travels from the scope to the
// table's report, the verification's record and the cutover check's evidence.
type BypassReport struct {
	Bypass        string    `json:"bypass,omitempty"`
	BypassNote    string    `json:"bypass_note,omitempty"`
	BypassKeys    int64     `json:"bypass_keys,omitempty"`
	BypassDDL     []string  `json:"bypass_ddl,omitempty"`
	BypassSince   time.Time `json:"bypass_since,omitzero"`
	BypassWatched time.Time `json:"bypass_watched_since,omitzero"`
}

// Equal reports whether the table pair is equal in structure and data.
func (t *TableReport) Equal() bool {
	return t.StructureEqual && t.DataCompared && t.DifferencesTotal == 0 && t.UndrilledChunks == 0
}

// Progress is reported after every finished chunk.
type Progress struct {
	RunID         string
	Tables        int
	TablesDone    int
	ChunksDone    int
	RowsChecked   int64
	RowsEstimated int64 // from table statistics; may be 0 or off
	Differences   int64
	Elapsed       time.Duration
	// Rechecking is set once the comparison has ended and the differences are read
	// again (recheck.go); ChangefeedLag is the changefeed's lag while the re-check waits
	// for it (0 otherwise).
	Rechecking    bool
	ChangefeedLag time.Duration
}

// Phase is what a run is doing.
type Phase string

const (
	// phaseStarting: opening the sources and the meta schema, storing the run.
	phaseStarting Phase = "starting"
	// phasePlanning: asking the servers what the comparison depends on, listing the
	// tables, loading and comparing their structures.
	phasePlanning Phase = "planning"
	// phaseComparing: cutting the tables into chunks and comparing them.
	phaseComparing Phase = "comparing"
	// phaseRechecking: reading the differences found again (Config.RecheckRounds).
	phaseRechecking Phase = "rechecking"
	// phaseConfirming: reading the differences found at a snapshot pair again at the
	// same pair (recheck.go).
	phaseConfirming Phase = "confirming"
	// phaseReporting: writing the report and the fix SQL.
	phaseReporting Phase = "reporting"
	// phaseFinished: the run has ended (Stats.State says how).
	phaseFinished Phase = "finished"
)

// Stats are a run's counters and gauges at one moment, for metrics: a daemon exports them
// (as Prometheus counters and gauges, say) without the checker depending on a metrics
// library, as kafka-go's Reader.Stats does. Diff.Stats returns them from any goroutine
// while the run goes on. Counts cover the run ID: a resumed run starts from what was
// stored.
type Stats struct {
	RunID string
	// State is the run's state (runRunning until it ends); Phase what it does.
	State string
	Phase Phase
	// PhaseTimes is how long each phase took, the current one so far (as vitess's vdiff
	// reports per-phase timings).
	PhaseTimes map[Phase]time.Duration
	Elapsed    time.Duration

	Tables     int
	TablesDone int
	// Chunks counts the chunks cut so far; ChunksDone those stored as compared;
	// ChunkRetries the chunks compared again after a transient error (in this process).
	Chunks       int
	ChunksDone   int
	ChunkRetries int64
	// RowsChecked counts the upstream rows compared, DownstreamRows the downstream ones;
	// RowsEstimated the upstream's rows by table statistics (may be 0 or off).
	RowsChecked    int64
	DownstreamRows int64
	RowsEstimated  int64
	// Differences counts the differing rows kept (a keyless difference with Count n
	// counts n); DifferencesResolved those the re-check found equal (in this process);
	// UndrilledChunks the mismatched chunks left undrilled (Config.MaxDifferences).
	// DifferencesUnconfirmed counts those the confirmation found equal at the same
	// snapshot pair (in this process; TableReport.DifferencesUnconfirmed).
	Differences            int64
	DifferencesResolved    int64
	DifferencesUnconfirmed int64
	UndrilledChunks        int
	RecheckRounds          int

	// Pauses counts the times new chunks were held back because the downstream was busy
	// or its changefeed lagged (Config.MaxThreadsRunning, Changefeed.MaxLag); Paused is how
	// long they were, in all; Pausing says they are now.
	Pauses  int64
	Paused  time.Duration
	Pausing bool

	// UpstreamSnapshot and DownstreamSnapshot name the points the sides read at ("": live).
	UpstreamSnapshot   string
	DownstreamSnapshot string

	// Scope is the run's scope (Config.Scope); ScopeKeys the keys its scoped tables read
	// (0 in a full run).
	Scope     string
	ScopeKeys int64
	// DifferencesByClass counts the differing rows by class once the run has classified
	// them (nil before), "in-flight" the rows the re-check resolved (classify.go).
	DifferencesByClass map[string]int64
}

// report assembles the report from the run state and writes the output directory.
func (tk *tracker) report(ctx context.Context, pair *sourcePair) (*Report, error) {
	tk.mu.Lock()
	targets, tallies, rechecks, scopes, classes := tk.targets, tk.tallies, tk.rechecks, tk.scopes, tk.classes
	rep := &Report{RunID: tk.st.runID, State: runDone, StartedAt: tk.start.UTC(), FinishedAt: time.Now().UTC(),
		Upstream: pair.src[upSide].Describe(), Downstream: pair.src[downSide].Describe(), Equal: true,
		UpstreamSnapshot: pair.snapshot[upSide], DownstreamSnapshot: pair.snapshot[downSide],
		RecheckRounds: rechecks, Classification: tk.classification}
	tk.mu.Unlock()
	rep.Scope = tk.cfg.scope.String()
	resolved, unconfirmed, err := tk.st.rechecksByTable(ctx)
	if err != nil {
		return nil, err
	}
	for i, t := range targets {
		tr := TableReport{Schema: t.stored.upSchema, Table: t.stored.upTable, DownstreamSchema: t.stored.downSchema,
			DownstreamTable: t.stored.downName, StructureEqual: structureEqual(t.problems), StructureProblems: t.problems,
			DataCompared: !t.fatal, Differences: []Difference{}}
		if t.plan != nil {
			tr.Keyless = t.plan.Keyless
			if !t.plan.Keyless {
				tr.Key = t.plan.keyNames()
			}
		}
		tl := tallies[i]
		tl.mu.Lock()
		tr.RowsChecked, tr.DownstreamRows, tr.Chunks, tr.DifferencesTotal = tl.upRows, tl.downRows, tl.chunksDone, tl.differences
		tr.UndrilledChunks = tl.undrilled
		tl.mu.Unlock()
		tr.DifferencesResolved, tr.DifferencesUnconfirmed = resolved[t.idx], unconfirmed[t.idx]
		if scopes != nil && scopes[i] != nil && !t.fatal {
			sc := scopes[i]
			tr.Scope, tr.ScopeNote = sc.mode, sc.note
			if sc.mode == tableKeys {
				tr.ScopeFromTs, tr.ScopeUntilTs, tr.ScopeKeys = sc.from, sc.until, int64(len(sc.keys))
			}
			tr.BypassReport = sc.bypass
		}
		if m := classes[t.idx]; len(m) > 0 || tr.DifferencesResolved > 0 {
			tr.DifferencesByClass = map[string]int64{}
			for c, n := range m {
				tr.DifferencesByClass[c] = n
			}
			if tr.DifferencesResolved > 0 {
				tr.DifferencesByClass[ClassInFlight] = tr.DifferencesResolved
			}
			if rep.DifferencesByClass == nil {
				rep.DifferencesByClass = map[string]int64{}
			}
			for c, n := range tr.DifferencesByClass {
				rep.DifferencesByClass[c] += n
			}
		}
		if tr.DifferencesTotal > 0 {
			err := tk.st.differences(ctx, t.idx, tk.cfg.MaxReportedDifferences, false, func(d Difference, _ string) error {
				tr.Differences = append(tr.Differences, d)
				return nil
			})
			if err != nil {
				return nil, err
			}
			tr.DifferencesTruncated = int64(len(tr.Differences)) < tr.DifferencesTotal
			if tk.cfg.OutputDir != "" {
				name, err := tk.writeFix(ctx, t)
				if err != nil {
					return nil, err
				}
				tr.FixSQLFile = name
			}
		}
		if !tr.Equal() {
			rep.Equal = false
		}
		rep.Tables = append(rep.Tables, tr)
	}
	if tk.cfg.OutputDir != "" {
		if err := writeReport(tk.cfg.OutputDir, rep); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

func fileSafe(s string) string {
	var b strings.Builder
	for _, c := range s {
		if c == '-' || c == '_' || c == '.' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') {
			b.WriteRune(c)
		} else {
			b.WriteString("%" + strconv.FormatInt(int64(c), 16))
		}
	}
	return b.String()
}

// writeFix writes fix/<schema>.<table>.sql from the stored differences (streamed).
func (tk *tracker) writeFix(ctx context.Context, t *target) (string, error) {
	name := filepath.Join("fix", fileSafe(t.stored.downSchema)+"."+fileSafe(t.stored.downName)+".sql")
	full := filepath.Join(tk.cfg.OutputDir, name)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		return "", fmt.Errorf("write fix sql: %w", err)
	}
	f, err := os.Create(full)
	if err != nil {
		return "", fmt.Errorf("write fix sql: %w", err)
	}
	defer f.Close()
	err = tk.st.fixSQL(ctx, t.stored, true, func(sql string) error {
		_, err := f.WriteString(sql)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("write fix sql %s: %w", full, err)
	}
	return name, f.Close()
}

// writeReport writes dir/report.json atomically.
func writeReport(dir string, rep *Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	tmp := filepath.Join(dir, ".report.json.tmp")
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "report.json")); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}
