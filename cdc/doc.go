// Package cdc replicates a TiCDC open-protocol changefeed from Kafka into the fallback
// MySQL, exactly once and in commit-ts order, and knows at every moment which upstream
// TSO the fallback reflects.
//
// # Running it
//
// From the command line: `parity serve --config parity.toml` (deploy/parity.example.toml
// documents every key; docs/serve.md the operation). From Go:
//
//	cfg := cdc.DefaultConfig()
//	cfg.Changefeed.Brokers = []string{"127.0.0.1:9092"}
//	cfg.Changefeed.Topics = []string{"ticdc-open"}
//	cfg.Downstream.DSN = "root@tcp(127.0.0.1:3306)/"
//	r, err := cdc.New(cfg, slog.Default())
//	...
//	err = r.Run(ctx) // until ctx ends (returns nil after finishing the round in progress) or a failure
//
// While Run runs, other goroutines may call:
//   - Status(): applied checkpoint ts, global resolved ts, their lag in seconds (wall
//     clock minus the TSO's physical time), per-partition resolved ts, offsets and Kafka
//     lag, buffered/spilled rows, counters. The daemon (package daemon) exports it as
//     Prometheus metrics; cdc imports no metrics library.
//   - AppliedNotify(ts) / WaitApplied(ctx, ts): fire once the applied checkpoint >= ts.
//   - Barrier(ctx, T, fn): hold the downstream exactly at T (every event with commit ts
//     <= T committed, nothing newer applied), run fn, then resume.
//
// # How it works
//
// One reader per partition of every topic (kafka-go Reader with an explicit partition;
// no consumer group, no Kafka offset commits) decodes records with cdc/open and hands
// them to a single coordinator goroutine. The coordinator keeps each partition's resolved
// ts (monotonic max; replayed older ones are ignored); the global resolved ts G is the
// minimum over all partitions. Row events wait in per-table buffers; beyond
// applier.memory-bytes the largest table's rows are sorted and written to a spill run on
// local disk (runs are sorted and indexed by ts, so a round reads a prefix of each run
// sequentially and a failed round can re-read it).
//
// When G advances (or a barrier / DDL is due) the coordinator applies a round: all rows
// with commit ts <= target, per table in (commit ts, arrival) order, over
// applier.workers connections (see applier for the routing rules). DDLs are applied at
// their barrier: rows up to the DDL's commit ts first, then the DDL, once, although
// TiCDC broadcasts it to every partition (deduplicated on (commit ts, query)); TiDB-only
// syntax is stripped, TiDB-only DDL types are skipped, and a DDL the downstream rejects
// stops the applier with an error quoting it.
//
// # Exactly once
//
// The meta schema (applier.meta-schema, default parity_meta, created and migrated by
// parity with append-only numbered migrations) holds, per changefeed, the applied
// checkpoint ts and the next Kafka offset of every partition: the smallest offset of a
// record still holding an unapplied event, so resuming there re-reads everything not yet
// applied. The checkpoint is written only after every row of the round is durable.
// After a crash anywhere in a round, a restart re-reads the round and:
//   - drops rows with commit ts <= the checkpoint (also replays TiCDC sends at newer
//     offsets: what counts is what is durably applied, never the newest ts seen);
//   - re-applies rows of tables with a handle key: upserts (INSERT ... ON DUPLICATE KEY
//     UPDATE, or REPLACE when another unique key exists) and deletes by handle are
//     idempotent in commit order, so the replay converges;
//   - skips rows of tables without a handle key up to the table's progress row, which
//     was committed in the same transaction as those rows, so duplicates never double;
//   - re-runs a DDL that ran but was not recorded, tolerating "already exists" errors.
//
// A record that cannot be decoded stops its partition at that offset (RecordError names
// topic, partition and offset) after applying what the resolved ts already allows; with
// applier.dead-letter it is copied to <meta>.dead_letter and replication continues.
// Transient downstream errors are retried with backoff; others stop the replicator.
package cdc
