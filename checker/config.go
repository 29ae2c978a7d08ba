package checker

// config.go owns a run's configuration: Config and its parts (sides, routes, tables,
// changefeed), each field's default (DefaultConfig), TLS, and Validate, which reports
// every problem with its key path; and the table patterns the daemon shares. It must not
// open connections nor decide anything at run time.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"strings"
	"time"

	"github.com/tidb-parity/parity/internal/tlsauth"
)

// SourceConfig says how to reach one side.
type SourceConfig struct {
	// DSN in go-sql-driver/mysql form, e.g. "root@tcp(127.0.0.1:4000)/".
	// Default: none (required unless the caller hands in a Source).
	DSN string `toml:"dsn" json:"-"`
	// Snapshot is a TiDB TSO (or datetime) to read the upstream at, through tidb_snapshot.
	// Default: "" (read the latest data).
	Snapshot string `toml:"snapshot" json:"snapshot,omitempty"`
	// Concurrency caps the connections (and so the concurrent queries) on this side.
	// Default: 0, meaning Config.Concurrency.
	Concurrency int `toml:"concurrency" json:"concurrency,omitempty"`
	// TLS encrypts the connections to this side ([upstream.tls], [downstream.tls]:
	// ca-file, cert-file, key-file, server-name, insecure-skip-verify;
	// docs/security.md). The downstream's also serves the meta database when it is the
	// downstream (meta-dsn unset).
	// Default: off (the DSN's own tls parameter, if any)
	TLS tlsauth.TLS `toml:"tls" json:"-"`
}

// Route maps upstream tables to downstream names. From is "schema" or "schema.table"
// with * and ? wildcards; To is "schema" (table name kept) or "schema.table".
type Route struct {
	From string `toml:"from" json:"from"`
	To   string `toml:"to" json:"to"`
}

// TableConfig holds per-table options; Table is "schema.table" with wildcards.
type TableConfig struct {
	Table string `toml:"table" json:"table"`
	// Where filters the compared rows on both sides (a SQL boolean expression).
	// Default: "" (all rows).
	Where string `toml:"where" json:"where,omitempty"`
}

// ChangefeedConfig names the changefeed (parity serve) that replicates into the
// downstream. Reading the downstream under a diff's load must not hold its replication
// back: with MaxLag, new chunks wait while the changefeed's applied checkpoint is older
// than that.
type ChangefeedConfig struct {
	// ID is parity serve's changefeed.id. Default: "" (none).
	ID string `toml:"id" json:"id,omitempty"`
	// MetaSchema is parity serve's applier.meta-schema, on the downstream. Default:
	// "parity_meta".
	MetaSchema string `toml:"meta-schema" json:"meta_schema,omitempty"`
	// MaxLag pauses new chunks while the changefeed lags by more than this (0: never).
	// Default: 0.
	MaxLag time.Duration `toml:"max-lag" json:"max_lag,omitempty"`
}

// Config configures a diff run.
type Config struct {
	Upstream   SourceConfig `toml:"upstream" json:"upstream"`
	Downstream SourceConfig `toml:"downstream" json:"downstream"`
	// Tables are the upstream tables to compare, "schema.table" with * and ? wildcards.
	// Default: none (required).
	Tables []string `toml:"tables" json:"tables"`
	// Exclude removes tables matched by Tables. Default: none.
	Exclude []string `toml:"exclude" json:"exclude,omitempty"`
	// Routes rename upstream schemas/tables to downstream ones; the first match wins.
	// Default: none (same names on both sides).
	Routes []Route `toml:"routes" json:"routes,omitempty"`
	// IgnoreColumns are "schema.table.column" patterns left out of every comparison.
	// Default: none.
	IgnoreColumns []string `toml:"ignore-columns" json:"ignore_columns,omitempty"`
	// TableConfigs hold per-table options (the first matching entry applies). Default: none.
	TableConfigs []TableConfig `toml:"table" json:"table,omitempty"`

	// Concurrency is the number of chunks compared at once (each uses one connection per
	// side). Default: 4.
	Concurrency int `toml:"concurrency" json:"concurrency"`
	// ChunkTargetTime is the time a chunk checksum query should take on the slower side;
	// chunk sizes adapt towards it. Default: 500ms.
	ChunkTargetTime time.Duration `toml:"chunk-target-time" json:"chunk_target_time"`
	// InitialChunkRows is the size of the first chunks of a table (kept within
	// [MinChunkRows, MaxChunkRows]). Default: 10000.
	InitialChunkRows int `toml:"initial-chunk-rows" json:"initial_chunk_rows"`
	// MinChunkRows and MaxChunkRows bound adaptive chunk sizes. Default: 1000 and 500000.
	MinChunkRows int `toml:"min-chunk-rows" json:"min_chunk_rows"`
	MaxChunkRows int `toml:"max-chunk-rows" json:"max_chunk_rows"`
	// MinChunks is how many chunks a table with a known size is cut into at least (chunks
	// stay within [MinChunkRows, MaxChunkRows]): small chunks localise differences, so a
	// mismatched chunk's drill-down re-reads a small part of the table. Default: 256.
	MinChunks int `toml:"min-chunks" json:"min_chunks"`
	// TiDBMinChunks replaces MinChunks when the upstream is TiDB, whose per-query cost is
	// much higher (about 6 ms of CPU per chunk query against 0.3 ms on MariaDB, and a
	// 4,000-row chunk ramps its batches up from 32 rows): per 1M sysbench rows, 250
	// chunks cost 3.4-4.0 s of TiDB CPU, 63 chunks 2.4-2.7 s. Once rows differ, chunks
	// shrink anyway (see docs/diff.md). Default: 64.
	TiDBMinChunks int `toml:"tidb-min-chunks" json:"tidb_min_chunks"`
	// RowDiffRows: a mismatched range with at most this many rows is compared row by row
	// (both sides' full rows streamed in key order and merged); larger ones are narrowed
	// first by bucket checksums (integer keys) or bisection. Streaming a default-sized
	// chunk's rows is cheaper than checksumming it again: 3.4 ms against 7.3 ms per 4,000
	// sysbench rows for the bucket checksum on MariaDB, 8.5 ms against 12 ms on TiDB
	// (docs/diff.md); 20,000 covers the default chunks of tables up to 5 million rows
	// (1.28 million from TiDB). Default: 20000.
	RowDiffRows int `toml:"row-diff-rows" json:"row_diff_rows"`
	// Hash is the per-row hash of the checksum query. Default: "sha1".
	Hash Hash `toml:"hash" json:"hash"`
	// TiDBChecksum is where a TiDB side computes its chunk checksums: "pushdown" in the
	// coprocessor (TiKV hashes its regions in parallel and returns one partial aggregate
	// each; TiDB only adds them up), "tidb" in the TiDB server (TiKV ships the rows and
	// TiDB hashes them, vectorised), or "auto": pushdown when TiDB's store is TiKV, tidb
	// on the embedded unistore, whose coprocessor evaluates row by row (per 1M sysbench
	// rows about 1 s more than TiDB's vectorised form). Default: "auto".
	TiDBChecksum TiDBChecksum `toml:"tidb-checksum" json:"tidb_checksum,omitempty"`

	// MaxRowsPerSecond caps the rows checksummed per second over all workers (0: no cap).
	// Default: 0.
	MaxRowsPerSecond int `toml:"max-rows-per-second" json:"max_rows_per_second,omitempty"`
	// MaxThreadsRunning pauses new chunks while the downstream's Threads_running is above
	// it (0: never pause). Default: 0.
	MaxThreadsRunning int `toml:"max-threads-running" json:"max_threads_running,omitempty"`
	// Changefeed names the changefeed that replicates into the downstream, so that new
	// chunks wait while it lags, and whose dirty-key ledger scopes and classifies a run.
	Changefeed ChangefeedConfig `toml:"changefeed" json:"changefeed"`
	// Scope is what a run compares of each table (dirty.go, docs/diff.md): "full" (every
	// row, in key-range chunks: covers imported data), "since:<TSO|RFC 3339 time>" (the
	// keys the changefeed changed after that point, from its dirty-key ledger) or "cdc"
	// (the keys it changed since the table's last clean verification). The scoped forms
	// need Changefeed.ID; a keyless table is compared whole in them. Default: "full".
	Scope string `toml:"scope" json:"scope,omitempty"`
	// Bypass, when set, adds to each scoped table's keys those of the writes that
	// bypassed parity (the bypass detector's records, internal/bypasslog) over the
	// table's window, after waiting until the detector has read the fallback's binlog up
	// to now, and says per table whether it watched the whole window
	// (TableReport.Bypass, bypasskeys.go). nil: a scoped table's keys are the
	// changefeed's alone and its report says bypass writes were not included. Default:
	// nil (parity serve's verification sets its detector).
	Bypass BypassWatcher `toml:"-" json:"-"`
	// WholeTables are tables ("schema.table", upstream names) that a scoped run compares
	// whole, as a full run would: what a cutover check asks for tables whose window no
	// one watched. Default: [] (none).
	WholeTables []string `toml:"-" json:"-"`
	// CaughtUpLag classifies differences (classify.go): a key last changed before the
	// applier first came within this lag of real time (by its ts-map) is "post-import",
	// one changed later "cdc". Default: 30s.
	CaughtUpLag time.Duration `toml:"caught-up-lag" json:"caught_up_lag,omitempty"`
	// Lag reports how far the changefeed's applied checkpoint is behind (parity diff
	// reads it with cdc.CheckpointLag); required when Changefeed.MaxLag is set.
	Lag func(ctx context.Context) (time.Duration, error) `toml:"-" json:"-"`
	// QueryTimeout bounds every query. Default: 5m.
	QueryTimeout time.Duration `toml:"query-timeout" json:"query_timeout"`

	// MaxReportedDifferences caps the differences listed per table in the report (the
	// total is always counted, and fix SQL covers all of them). Default: 1000.
	MaxReportedDifferences int `toml:"max-reported-differences" json:"max_reported_differences"`
	// MaxDifferences stops the drill-down of a table once this many of its rows were found
	// to differ (0: never). Its later mismatched chunks are still found by their checksums
	// and reported as undrilled (TableReport.UndrilledChunks), but their rows are not
	// compared, stored or fixed: a table that is wholly different (truncated, or loaded from
	// the wrong source) costs a checksum pass, not a row-by-row copy of itself into the meta
	// schema on the downstream. Default: 100000.
	MaxDifferences int64 `toml:"max-differences" json:"max_differences"`
	// RecheckRounds: when the two sides were not both read at a snapshot, the rows of the
	// differences found are read again, by key on both sides, this many times once the
	// comparison has ended (see recheck.go). A row equal by then was in flight (written
	// upstream, not yet replicated, when first read): it is dropped from the differences
	// and counted in TableReport.DifferencesResolved. 0: never. Default: 1.
	RecheckRounds int `toml:"recheck-rounds" json:"recheck_rounds"`
	// RecheckDelay is how long after the comparison (or the previous round) ended a
	// re-check round starts: time for replication to apply what was in flight. With
	// Changefeed.ID set, a round also waits until the changefeed's applied checkpoint has
	// passed that moment (at most RecheckMaxWait). Default: 0 (the first round starts when
	// the comparison ends; the differences found early in a run have aged by then).
	RecheckDelay time.Duration `toml:"recheck-delay" json:"recheck_delay,omitempty"`
	// RecheckMaxWait bounds a round's wait for the changefeed's checkpoint. Default: 1m.
	RecheckMaxWait time.Duration `toml:"recheck-max-wait" json:"recheck_max_wait"`
	// OutputDir receives report.json and the fix SQL files. Default: "" (no files).
	OutputDir string `toml:"output" json:"-"`
	// MetaDSN is where the run state lives (schema MetaSchema). Default: the downstream DSN.
	MetaDSN string `toml:"meta-dsn" json:"-"`
	// MetaSchema is the schema holding the diff_* state tables. Default: "parity_meta".
	MetaSchema string `toml:"meta-schema" json:"meta_schema"`
	// Resume continues the run with this ID instead of starting a new one. Default: "".
	Resume string `toml:"-" json:"-"`

	// Started, when set, is called once with the run's ID as soon as the run is stored
	// (before any chunk), so a caller can tell a user how to resume it.
	Started func(runID string) `toml:"-" json:"-"`
	// Progress, when set, is called whenever finished chunks have been stored (once per
	// batch of the run's journal, so possibly once for several chunks; never concurrently).
	Progress func(Progress) `toml:"-" json:"-"`
	// ChunkDone, when set, is called after each attempt to compare a chunk with its
	// result (ChunkEqual, ChunkDifferent or ChunkFailed; not when the run is cancelled)
	// and how long the attempt took, for metrics. It may be called concurrently.
	ChunkDone func(result string, took time.Duration) `toml:"-" json:"-"`
	// Logger receives structured logs (never row values). Default: slog.Default().
	Logger *slog.Logger `toml:"-" json:"-"`

	// scope is Scope parsed, by Validate (which every run calls first).
	scope ScopeSpec

	// groupedChunks checksums every chunk of a single-integer-key table per key bucket,
	// whatever the cost model says (chunkSizer.plan), so tests cover that path. Default:
	// false.
	groupedChunks bool
}

// DefaultConfig returns a Config with every default filled in.
func DefaultConfig() Config {
	return Config{
		Concurrency:            4,
		ChunkTargetTime:        500 * time.Millisecond,
		InitialChunkRows:       10000,
		MinChunkRows:           1000,
		MaxChunkRows:           500000,
		MinChunks:              256,
		TiDBMinChunks:          64,
		RowDiffRows:            20000,
		Hash:                   HashSHA1,
		TiDBChecksum:           TiDBChecksumAuto,
		Changefeed:             ChangefeedConfig{MetaSchema: "parity_meta"},
		QueryTimeout:           5 * time.Minute,
		MaxReportedDifferences: 1000,
		MaxDifferences:         100000,
		RecheckRounds:          1,
		RecheckMaxWait:         time.Minute,
		MetaSchema:             "parity_meta",
		Scope:                  ScopeFull,
		CaughtUpLag:            30 * time.Second,
	}
}

// Validate reports every problem with its key path.
// ApplyTLS applies [upstream.tls] and [downstream.tls] to their DSNs (tlsauth.DSN: a
// TLS config registered with the driver and named in the DSN) and clears them, so every
// connection opened from the DSNs (sources, the meta database, the changefeed's lag)
// uses TLS. The certificate files are read now.
func (c *Config) ApplyTLS() error {
	for _, s := range []struct {
		sc  *SourceConfig
		key string
	}{{&c.Upstream, "upstream.tls"}, {&c.Downstream, "downstream.tls"}} {
		if s.sc.DSN == "" {
			continue
		}
		dsn, err := tlsauth.DSN(s.sc.DSN, s.sc.TLS, s.key)
		if err != nil {
			return err
		}
		s.sc.DSN, s.sc.TLS = dsn, tlsauth.TLS{}
	}
	return nil
}

// TLSWarnings are the warnings of c's TLS settings (certificates not verified).
func (c *Config) TLSWarnings() []string {
	return append(c.Upstream.TLS.Warnings("upstream.tls"), c.Downstream.TLS.Warnings("downstream.tls")...)
}

func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	for _, e := range []error{
		c.Upstream.TLS.Validate("upstream.tls"), c.Upstream.TLS.ValidateDSN("upstream.tls", c.Upstream.DSN),
		c.Downstream.TLS.Validate("downstream.tls"), c.Downstream.TLS.ValidateDSN("downstream.tls", c.Downstream.DSN),
	} {
		if e != nil {
			errs = append(errs, e)
		}
	}
	if len(c.Tables) == 0 {
		bad("tables", "at least one table pattern is required")
	}
	for i, t := range c.Tables {
		if err := checkPattern(t, 2); err != nil {
			bad(fmt.Sprintf("tables[%d]", i), "%v", err)
		}
	}
	for i, t := range c.Exclude {
		if err := checkPattern(t, 2); err != nil {
			bad(fmt.Sprintf("exclude[%d]", i), "%v", err)
		}
	}
	for i, r := range c.Routes {
		from, to := strings.Count(r.From, "."), strings.Count(r.To, ".")
		if r.From == "" || from > 1 || checkPattern(r.From, from+1) != nil {
			bad(fmt.Sprintf("routes[%d].from", i), "want schema or schema.table, got %q", r.From)
		}
		if r.To == "" || to > 1 || strings.ContainsAny(r.To, "*?") || (to == 1 && from == 0) {
			bad(fmt.Sprintf("routes[%d].to", i), "want schema (or schema.table when from names a table), got %q", r.To)
		}
	}
	for i, p := range c.IgnoreColumns {
		if err := checkPattern(p, 3); err != nil {
			bad(fmt.Sprintf("ignore-columns[%d]", i), "%v", err)
		}
	}
	for i, t := range c.TableConfigs {
		if err := checkPattern(t.Table, 2); err != nil {
			bad(fmt.Sprintf("table[%d].table", i), "%v", err)
		}
		if strings.Contains(t.Where, ";") {
			bad(fmt.Sprintf("table[%d].where", i), "must be one expression, found ';'")
		}
	}
	if c.Concurrency < 1 {
		bad("concurrency", "must be at least 1, got %d", c.Concurrency)
	}
	if c.Upstream.Concurrency < 0 {
		bad("upstream.concurrency", "must not be negative")
	}
	if c.Downstream.Concurrency < 0 {
		bad("downstream.concurrency", "must not be negative")
	}
	if c.ChunkTargetTime <= 0 {
		bad("chunk-target-time", "must be positive, got %s", c.ChunkTargetTime)
	}
	if c.MinChunkRows < 1 {
		bad("min-chunk-rows", "must be at least 1, got %d", c.MinChunkRows)
	}
	if c.MaxChunkRows < c.MinChunkRows {
		bad("max-chunk-rows", "must be at least min-chunk-rows (%d), got %d", c.MinChunkRows, c.MaxChunkRows)
	}
	if c.MinChunks < 1 {
		bad("min-chunks", "must be at least 1, got %d", c.MinChunks)
	}
	if c.TiDBMinChunks < 1 {
		bad("tidb-min-chunks", "must be at least 1, got %d", c.TiDBMinChunks)
	}
	if c.InitialChunkRows < 1 {
		bad("initial-chunk-rows", "must be at least 1, got %d", c.InitialChunkRows)
	}
	if c.RowDiffRows < 1 {
		bad("row-diff-rows", "must be at least 1, got %d", c.RowDiffRows)
	}
	switch c.TiDBChecksum {
	case TiDBChecksumAuto, TiDBChecksumPushdown, TiDBChecksumTiDB, "":
	default:
		bad("tidb-checksum", "want auto, pushdown or tidb, got %q", c.TiDBChecksum)
	}
	switch c.Hash {
	case HashSHA1, HashMD5, HashCRC32Pair:
	default:
		bad("hash", "want sha1, md5 or crc32pair, got %q", c.Hash)
	}
	if c.MaxRowsPerSecond < 0 {
		bad("max-rows-per-second", "must not be negative")
	}
	if c.MaxThreadsRunning < 0 {
		bad("max-threads-running", "must not be negative")
	}
	if c.Changefeed.MaxLag < 0 {
		bad("changefeed.max-lag", "must not be negative, got %s", c.Changefeed.MaxLag)
	}
	if c.Changefeed.MaxLag > 0 && c.Changefeed.ID == "" {
		bad("changefeed.id", "is required with changefeed.max-lag")
	}
	if c.Changefeed.ID != "" && c.Changefeed.MetaSchema == "" {
		bad("changefeed.meta-schema", "is required with changefeed.id")
	}
	if spec, err := ParseScope(c.Scope); err != nil {
		bad("scope", "%v", err)
	} else {
		c.scope = spec // the one parse of the run's scope: the runner reads it from here
		if spec.Kind != ScopeFull && c.Changefeed.ID == "" {
			bad("changefeed.id", "is required with scope %s (the keys come from the changefeed's dirty-key ledger)", c.Scope)
		}
	}
	if c.CaughtUpLag < 0 {
		bad("caught-up-lag", "must not be negative, got %s", c.CaughtUpLag)
	}
	if c.QueryTimeout <= 0 {
		bad("query-timeout", "must be positive, got %s", c.QueryTimeout)
	}
	if c.MaxReportedDifferences < 0 {
		bad("max-reported-differences", "must not be negative")
	}
	if c.MaxDifferences < 0 {
		bad("max-differences", "must not be negative")
	}
	if c.RecheckRounds < 0 {
		bad("recheck-rounds", "must not be negative, got %d", c.RecheckRounds)
	}
	if c.RecheckDelay < 0 {
		bad("recheck-delay", "must not be negative, got %s", c.RecheckDelay)
	}
	if c.RecheckMaxWait < 0 {
		bad("recheck-max-wait", "must not be negative, got %s", c.RecheckMaxWait)
	}
	if c.MetaSchema == "" {
		bad("meta-schema", "is required")
	}
	return errors.Join(errs...)
}

// CheckTablePattern checks a "schema.table" pattern as a run reads its tables.
func CheckTablePattern(p string) error { return checkPattern(p, 2) }

func checkPattern(p string, parts int) error {
	fields := strings.Split(p, ".")
	if len(fields) != parts {
		want := []string{"", "schema", "schema.table", "schema.table.column"}[parts]
		return fmt.Errorf("want %s, got %q", want, p)
	}
	for _, f := range fields {
		if f == "" {
			return fmt.Errorf("empty name in %q", p)
		}
		if _, err := path.Match(f, ""); err != nil {
			return fmt.Errorf("bad pattern %q: %w", p, err)
		}
	}
	return nil
}

// MatchTable reports whether schema.table matches a "schema.table" pattern, each part
// with path.Match wildcards, as a run selects its tables.
func MatchTable(pattern, schema, table string) bool { return matchName(pattern, schema, table) }

// ExactTablePattern returns the pattern that selects exactly schema.table: its wildcard
// characters escaped. A name with a dot cannot be selected alone (patterns split at
// dots).
func ExactTablePattern(schema, table string) (string, error) {
	if strings.Contains(schema, ".") || strings.Contains(table, ".") {
		return "", fmt.Errorf("table %s.%s: a name containing '.' cannot be selected alone (table patterns split at dots)", schema, table)
	}
	esc := func(s string) string {
		var b strings.Builder
		for _, r := range s {
			if strings.ContainsRune(`*?[]\`, r) {
				b.WriteByte('\\')
			}
			b.WriteRune(r)
		}
		return b.String()
	}
	return esc(schema) + "." + esc(table), nil
}

// matchName matches "a.b[.c]" names against a pattern of the same shape, each part with
// path.Match wildcards.
func matchName(pattern string, names ...string) bool {
	parts := strings.Split(pattern, ".")
	if len(parts) != len(names) {
		return false
	}
	for i, p := range parts {
		if ok, _ := path.Match(p, names[i]); !ok {
			return false
		}
	}
	return true
}

func (c *Config) selected(schema, table string) bool {
	in := false
	for _, p := range c.Tables {
		if matchName(p, schema, table) {
			in = true
			break
		}
	}
	if !in {
		return false
	}
	for _, p := range c.Exclude {
		if matchName(p, schema, table) {
			return false
		}
	}
	return true
}

// route returns the downstream schema and table for an upstream table.
func (c *Config) route(schema, table string) (string, string) {
	for _, r := range c.Routes {
		if strings.Contains(r.From, ".") {
			if matchName(r.From, schema, table) {
				if s, t, ok := strings.Cut(r.To, "."); ok {
					return s, t
				}
				return r.To, table
			}
			continue
		}
		if matchName(r.From, schema) {
			return r.To, table
		}
	}
	return schema, table
}

func (c *Config) ignoredFunc(schema, table string) func(string) bool {
	return func(col string) bool {
		for _, p := range c.IgnoreColumns {
			if matchName(p, schema, table, col) {
				return true
			}
		}
		return false
	}
}

func (c *Config) where(schema, table string) string {
	for _, tc := range c.TableConfigs {
		if matchName(tc.Table, schema, table) {
			return tc.Where
		}
	}
	return ""
}
