package checker

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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
	// UpstreamSnapshot and DownstreamSnapshot are the TiDB snapshots (TSO or datetime) the
	// sides were read at, when set: "equal" holds between those points.
	UpstreamSnapshot   string `json:"upstream_snapshot,omitempty"`
	DownstreamSnapshot string `json:"downstream_snapshot,omitempty"`
	// RecheckRounds counts the rounds in which the rows of the differences were read
	// again (Config.RecheckRounds; none when both sides were read at a snapshot).
	RecheckRounds int           `json:"recheck_rounds,omitempty"`
	Equal         bool          `json:"equal"`
	Tables        []TableReport `json:"tables"`
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
	// FixSQLFile is the fix SQL file, relative to the output directory.
	FixSQLFile string `json:"fix_sql_file,omitempty"`
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
