package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/tidb-parity/parity/cdc/loadgen"
	"github.com/tidb-parity/parity/cdc/open"
)

func init() {
	addCommand(newLoadgenCommand)
}

func newLoadgenCommand() *cobra.Command {
	cfg := loadgen.DefaultConfig()
	var compression, logLevel, largeMessage, claimCheckDir string
	var bigRows int
	cmd := &cobra.Command{
		Use:   "loadgen",
		Short: "Run a workload on TiDB and publish it to Kafka as a TiCDC changefeed would",
		Long: `loadgen stands in for TiCDC in tests, benchmarks and the demo. It creates sysbench-style
tables (sbtest1..N), an all-types table and a keyless table on the upstream TiDB,
optionally imports them into the downstream as a dump/import would (--import-rows; the
import TSO is printed and written to --import-ts-file), then runs insert/update/delete
transactions on TiDB and publishes every committed transaction to the Kafka topic with
its real commit ts, dispatched to partitions like TiCDC ("table" or "index-value"),
with resolved events broadcast to every partition. A resolved ts is published only after
every transaction committed at or before it is acknowledged by Kafka.

--protocol chooses the changefeed's protocol: open-protocol (default), canal-json (as
TiCDC writes it with enable-tidb-extension=true: one row per message, _tidb.commitTs,
TIDB_WATERMARK messages on every partition, DDLs on partition 0 only) or simple (JSON:
a BOOTSTRAP of each table on every partition before its first row, DDLs and WATERMARKs
on every partition, TiCDC's row checksums). canal-json and simple take no --compression
or --large-message-handle.

With --databases s1,s2,... it writes several schemas, each with the same tables (a
transaction may change tables of several schemas, --multi-table). A --topic holding
{schema} is a topic expression, TiCDC's topic-per-schema routing
(topic = "parity_{schema}" in a dispatcher rule): each schema's row events and DDLs go
to its own topic (created with --partitions when missing) and every resolved ts to every
partition of every topic, so one fallback can consume its schemas' topics alone:

  parity loadgen --databases s1,s2,s3,s4 --topic 'parity_{schema}'

The workload stops after --duration or --transactions (or on SIGINT/SIGTERM); loadgen
publishes a final resolved ts covering everything it committed, and prints:

  start_ts=<ts>       where the changefeed starts (the import TSO with --import-rows)
  import_ts=<ts>      with --import-rows
  resolved_ts=<ts>    the final resolved ts: the fallback must equal TiDB at this TSO
  transactions=<n> rows=<n> records=<n> aborted=<n>

After a workload that ended by --duration or --transactions it keeps running, as TiCDC
does while TiDB is idle: it publishes TiDB's current TSO as the resolved ts every
--resolved-interval (a heartbeat, so that parity wait-applied --now returns once the
writes stopped) until SIGINT or SIGTERM; --heartbeat=false exits when the workload ends.

Exit status: 0 done (stopped by a signal, or the workload ended with --heartbeat=false),
2 when the workload could not run to its end or on bad flags (the error is printed).

With --big-transaction-rows N it runs no workload: after the set-up it runs ONE
transaction inserting N rows into sbtest1 (multi-row INSERTs between BEGIN and COMMIT)
and publishes all N rows with its commit ts, then a resolved ts after it; it also prints
commit_ts=<ts> (the big transaction's commit ts).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Encoder.Compression = open.Compression(compression)
			cfg.Encoder.LargeMessageHandle = open.LargeMessageHandle(largeMessage)
			if claimCheckDir != "" {
				dir, err := filepath.Abs(claimCheckDir)
				if err != nil {
					return &exitError{code: exitNoAnswer, err: fmt.Errorf("claim-check-dir: %w", err)}
				}
				cfg.Encoder.ClaimCheckStorageURI = "file://" + dir
				cfg.Encoder.ClaimCheckWrite = func(name string, data []byte) error {
					return os.WriteFile(filepath.Join(dir, name), data, 0o644)
				}
			}
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
				return &exitError{code: exitNoAnswer, err: fmt.Errorf("log-level: %w", err)}
			}
			cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
			saslPasswordFromEnv(&cfg.KafkaSASL)
			if cmd.Flags().Changed("database") && cmd.Flags().Changed("databases") {
				return &exitError{code: exitNoAnswer, err: fmt.Errorf("database, databases: set one (--databases replaces --database)")}
			}
			validate := cfg.Validate
			if cmd.Flags().Changed("big-transaction-rows") {
				validate = func() error { return cfg.ValidateBigTransaction(bigRows) }
			}
			if err := validate(); err != nil {
				return &exitError{code: exitNoAnswer, err: err}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			var res loadgen.Result
			var err error
			var commitTs uint64
			out := cmd.OutOrStdout()
			printed := false
			summary := func(res loadgen.Result) {
				printed = true
				if commitTs != 0 {
					fmt.Fprintf(out, "commit_ts=%d\n", commitTs)
				}
				if res.StartTs != 0 {
					fmt.Fprintf(out, "start_ts=%d\n", res.StartTs)
				}
				if res.ImportTs != 0 {
					fmt.Fprintf(out, "import_ts=%d\n", res.ImportTs)
				}
				if res.ResolvedTs != 0 {
					fmt.Fprintf(out, "resolved_ts=%d\n", res.ResolvedTs)
				}
				fmt.Fprintf(out, "transactions=%d rows=%d records=%d aborted=%d\n", res.Transactions, res.Rows, res.Records, res.Aborted)
			}
			if cmd.Flags().Changed("big-transaction-rows") {
				var big loadgen.BigTxnResult
				big, err = loadgen.RunBigTransaction(ctx, cfg, bigRows)
				res, commitTs = big.Result, big.CommitTs
			} else {
				// The summary is printed when the workload ends, before the heartbeat.
				cfg.WorkloadEnded = summary
				res, err = loadgen.Run(ctx, cfg)
			}
			if !printed {
				summary(res)
			}
			if err != nil {
				return &exitError{code: exitNoAnswer, err: err} // the workload could not run to its end
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&cfg.Upstream, "upstream-dsn", cfg.Upstream, "upstream TiDB DSN")
	fl.StringVar(&cfg.Downstream, "downstream-dsn", cfg.Downstream, "downstream MySQL DSN (for --import-rows)")
	fl.StringSliceVar(&cfg.Brokers, "brokers", cfg.Brokers, "Kafka bootstrap addresses")
	fl.StringVar(&cfg.Protocol, "protocol", cfg.Protocol, "the changefeed's protocol, as TiCDC names it: open-protocol, canal-json (with the TiDB extension) or simple (JSON, row checksums)")
	fl.StringVar(&cfg.Topic, "topic", cfg.Topic, "Kafka topic of the changefeed; with {schema} (e.g. 'parity_{schema}') each schema's own topic, as TiCDC's topic dispatcher routes it")
	addTLSFlags(fl, "upstream", "the upstream", &cfg.UpstreamTLS)
	addTLSFlags(fl, "downstream", "the downstream", &cfg.DownstreamTLS)
	addTLSFlags(fl, "kafka", "Kafka", &cfg.KafkaTLS)
	addSASLFlags(fl, &cfg.KafkaSASL)
	fl.IntVar(&cfg.Partitions, "partitions", cfg.Partitions, "partitions of the topic when loadgen creates it (0: it must exist)")
	fl.BoolVar(&cfg.Reset, "reset", cfg.Reset, "drop the schemas on both sides first")
	fl.StringVar(&cfg.Database, "database", cfg.Database, "schema of the tables, on both sides")
	fl.StringSliceVar(&cfg.Databases, "databases", cfg.Databases, "several schemas, each with the same tables (replaces --database; comma-separated or repeated)")
	fl.IntVar(&cfg.Tables, "tables", cfg.Tables, "number of sysbench tables sbtest1..N")
	fl.StringVar(&cfg.IDType, "id-type", cfg.IDType, "type of the sysbench id column: int or bigint")
	fl.BoolVar(&cfg.AllTypes, "all-types", cfg.AllTypes, "add the table alltypes")
	fl.BoolVar(&cfg.Keyless, "keyless", cfg.Keyless, "add the table keyless (no primary or unique key)")
	fl.IntVar(&cfg.ImportRows, "import-rows", cfg.ImportRows, "rows per sysbench table to import before the changefeed starts (0: none)")
	fl.StringVar(&cfg.ImportTSFile, "import-ts-file", cfg.ImportTSFile, "file receiving the import TSO")
	fl.StringVar(&cfg.Dispatcher, "dispatcher", cfg.Dispatcher, "partition dispatcher: table or index-value")
	fl.IntVar(&cfg.Workers, "workers", cfg.Workers, "concurrent TiDB sessions")
	fl.Float64Var(&cfg.Rate, "rate", cfg.Rate, "transactions per second over all workers (0: unlimited)")
	fl.DurationVar(&cfg.Duration, "duration", cfg.Duration, "stop after this long (0: no limit)")
	fl.IntVar(&cfg.Transactions, "transactions", cfg.Transactions, "stop after this many transactions (0: no limit)")
	fl.IntVar(&cfg.RowsPerTxn, "rows-per-txn", cfg.RowsPerTxn, "most row changes per table in a transaction")
	fl.Float64Var(&cfg.MultiTable, "multi-table", cfg.MultiTable, "probability that a transaction changes 2-3 tables")
	fl.IntVar(&cfg.InsertWeight, "insert-weight", cfg.InsertWeight, "weight of inserts in the mix")
	fl.IntVar(&cfg.UpdateWeight, "update-weight", cfg.UpdateWeight, "weight of updates in the mix")
	fl.IntVar(&cfg.DeleteWeight, "delete-weight", cfg.DeleteWeight, "weight of deletes in the mix")
	fl.Float64Var(&cfg.PKUpdate, "pk-update", cfg.PKUpdate, "fraction of updates that change the primary key")
	fl.BoolVar(&cfg.RawPKUpdates, "raw-pk-updates", cfg.RawPKUpdates, "send primary-key updates as one update event, not delete+insert")
	fl.BoolVar(&cfg.CheckImages, "check-images", cfg.CheckImages, "re-read each committed transaction at its commit ts and stop on an image that differs from TiDB's row (one extra read per transaction)")
	fl.DurationVar(&cfg.FlushInterval, "flush-interval", cfg.FlushInterval, "how often committed transactions are published")
	fl.DurationVar(&cfg.ResolvedInterval, "resolved-interval", cfg.ResolvedInterval, "how often a resolved ts is broadcast")
	fl.BoolVar(&cfg.Heartbeat, "heartbeat", true, "after a workload that ended by --duration or --transactions, keep publishing TiDB's current TSO as the resolved ts every --resolved-interval until SIGINT/SIGTERM, as TiCDC does while TiDB is idle (false: exit when the workload ends)")
	fl.StringVar(&cfg.TimeZone, "time-zone", cfg.TimeZone, "session time zone of TIMESTAMP values (TiCDC's --tz)")
	fl.IntVar(&cfg.Encoder.MaxBatchSize, "max-batch-size", cfg.Encoder.MaxBatchSize, "most row events per Kafka record")
	fl.IntVar(&cfg.Encoder.MaxMessageBytes, "max-message-bytes", cfg.Encoder.MaxMessageBytes, "Kafka record size limit")
	fl.StringVar(&compression, "compression", string(cfg.Encoder.Compression), "payload compression: none, snappy or lz4")
	fl.StringVar(&largeMessage, "large-message-handle", string(open.LargeMessageNone), "what happens to a row event over --max-message-bytes (TiCDC's large-message-handle-option): none (an error), handle-key-only or claim-check")
	fl.StringVar(&claimCheckDir, "claim-check-dir", "", "directory receiving claim-check files (with --large-message-handle claim-check)")
	fl.IntVar(&bigRows, "big-transaction-rows", 0, "instead of the workload, run one transaction inserting this many rows into sbtest1")
	fl.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed (0: random)")
	fl.DurationVar(&cfg.ProgressInterval, "progress-interval", cfg.ProgressInterval, "how often progress is logged")
	fl.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	return cmd
}
