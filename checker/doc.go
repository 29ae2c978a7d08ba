// Package checker compares a table set between an upstream (TiDB or any MySQL-protocol
// server) and a downstream MySQL/MariaDB: it chunks every table by key range, compares
// pushed-down count+checksum aggregates per chunk, drills into mismatched chunks down to
// individual rows, and emits fix SQL. A run and its chunks are persisted in the meta
// schema (parity_meta.diff_*) so a killed run resumes where it stopped.
//
// The public face is what other packages use: one constructor, NewDiff(cfg, src) (src
// nil: open cfg's DSNs), whose Run returns the Report and whose Stats can be read while
// it runs; Config; the Sources a caller may hold (OpenDSN, OpenSnapshotPair); the result
// types (Report, TableReport, Difference, Stats, Classification); the readers of a
// finished run (RunDifferences, RunFixSQL, DeleteRun) and of clean verifications; and
// one planning entry point for the benchmarks (PlanChunkSQL: a table's per-chunk queries
// as a run plans them, chunksql.go). Everything else is unexported.
//
// It must not import cdc (the applier is reached through the Barrierer and
// BypassWatcher interfaces), api or Prometheus (it exposes Stats; the daemon exports
// metrics).
//
// A run (run.go) is a short story told by parts that each own one concern; each part's
// file opens with what it owns and what it must not do:
//   - the pair (pair.go): the two sources and what is known of them — flavour, where a
//     TiDB side computes its checksums, byte-ordered strings, packet size, and whether
//     each side reads at a snapshot (and which). Every query goes through it, bounded by
//     the query timeout and stopped on the server when it outlives it.
//   - the planner (planner.go): the table list and each table's plan, an immutable target.
//   - the scopes (scope.go, dirty.go): the units of work a table yields — rangeScope
//     cuts key ranges (chunks) and adapts their size to the comparer's feedback; keyScope
//     hands out the keys of stored differences; keyListScope the keys of a scoped run.
//     Modelled on spirit's chunker (Open, Next, Feedback).
//   - the comparer (comparer.go, drill.go, rowdiff.go): checksums a unit, drills a
//     mismatch down, merges rows, compares keyless multisets; it reports differences to a
//     sink it is given.
//   - the classifier (classify.go), beside the comparer: once the differences are final
//     (after the re-check), where each comes from — imported, post-import or cdc at a
//     snapshot pair (by the ledger and the ts-map), diverged or in flight otherwise, and
//     bypass for a key a write that bypassed parity changed. The runner builds it with
//     the store, the tracker and the pair; it holds none of the runner's state.
//   - the tracker (tracker.go, journal.go, report.go): totals, the one checkpoint rule,
//     the journal of chunk states, the difference budget and the sink that stores
//     differences within it, progress, Stats, the report and the fix SQL.
//   - the re-check (recheck.go), the throttles (throttle.go: rate cap, busy gate).
//   - the run's scope (dirty.go, bypasskeys.go): full, or the keys the changefeed changed
//     in a window of its dirty-key ledger (since:<TSO|time>, or cdc: since the table's
//     last clean verification) and the writes that bypassed parity in it, which
//     keyListScope hands out; a table the ledger cannot key is compared whole. The record
//     of clean verifications (verified.go), where scope cdc starts.
//
// Under them: source.go (a Source: a DSN pool, or connections the caller holds at a
// snapshot), schema.go (structures, key choice), encoding.go (the table plan, each
// column's text and the row encoding and hash), checksum.go (every checksum and
// row-streaming statement), sqltext.go (value literals; identifiers go through
// internal/ident), keys.go (row keys in Go: key values as internal/rowkey's types, the
// stored forms of chunk bounds and differences' keys, old and new, and "the same key
// under the collation" for maps), chunk.go (key ranges, chunk sizing, cutting by value),
// fix.go (fix SQL: built per difference, streamed per table), state.go (the persisted
// run state machine: runs, tables, chunks), differences.go (the stored differences, and
// a finished run's read from outside), snapshot.go (snapshot pairs), gc.go (TiDB's GC
// and snapshots; TSOs and error 8055 through internal/tso).
//
// Where this differs from the shape first sketched for it (../shared/design/next-wave.md
// section 3), and why:
//   - Reading at a snapshot is what a source says of itself (a DSNSource opened at a
//     tidb_snapshot, or connSourceConfig.Snapshot for connections opened inside the
//     applier's barrier), collected by the pair; not a flag given to the pair, which could
//     then claim a snapshot its sources do not read at.
//   - The difference budget and the storing sink are the tracker's; the comparer sees a
//     two-method differenceSink (full, emit). The re-check hands it a sink that collects in
//     memory, and a classification of differences can wrap one.
//   - A timed-out query on a connSource is stopped with KILL QUERY and its connection kept
//     (its transaction, and so its snapshot, cannot be reopened); on a DSNSource with KILL
//     CONNECTION and the connection discarded (the pool reopens it at the same
//     tidb_snapshot, and no late kill can reach the next statement).
//   - A unit's size and grouping are read from the sizer when the scope hands it out,
//     together, so a chunk is never checksummed by buckets of a size meant for another.
//   - A keyless table's re-check compares its stored chunks again rather than a key
//     scope: a keyless table has no key to read rows by.
//   - Differences are classified by a pass over the stored ones once they are final, not
//     by a sink wrapping the tracker's: a live run's classes depend on the re-check,
//     which comes after, and at a snapshot pair a table's ledger is read once for all its
//     differences (its memory bounded by them, not by the ledger).
package checker
