// Package loadgen is parity's workload generator. It stands in for TiCDC in tests,
// benchmarks and the demo: it creates sysbench-style tables and an all-types table on
// upstream TiDB, optionally imports them into the fallback MySQL as a dump/import would
// (recording the import TSO), then runs insert/update/delete transactions on TiDB and
// publishes every committed transaction to Kafka as TiCDC's open protocol would: with its
// real commit ts, full row images, TiCDC's column types and flags, dispatched to
// partitions by TiCDC's "table" or "index-value" rule, DDL and resolved events broadcast
// to every partition. With several schemas (Databases) and a topic expression
// ("parity_{schema}") each schema's changes go to its own topic, as TiCDC's topic
// dispatcher routes them, and every resolved ts to every topic. Config.Protocol chooses
// the wire format: the open protocol (cdc/open's encoder), canal-json with the TiDB
// extension (canal.go) or simple with row checksums (simple.go); the table definitions
// those two carry come from TiDB (wiretable.go), and both are checked against TiCDC's own
// messages (ticdc_wire_test.go).
//
// It is its own package because it needs both SQL and Kafka (cdc/open is a leaf) and must
// not live in the daemon's package cdc: it plays the other side of the wire.
//
// The resolved-ts invariant: a resolved ts T is published only after every transaction
// with commit ts ≤ T has been acknowledged by Kafka. See sequencer for how concurrent
// workers keep it.
package loadgen

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/tlsauth"
)

// Config configures a Generator.
type Config struct {
	// Upstream is the TiDB DSN (go-sql-driver/mysql format). Default: "root@tcp(127.0.0.1:4000)/".
	Upstream string
	// Downstream is the fallback MySQL DSN; used only by the import. Default: "".
	Downstream string
	// UpstreamTLS and DownstreamTLS are the TLS of the connections to Upstream and
	// Downstream (applied to their DSNs, tlsauth.DSN). Default: off.
	UpstreamTLS, DownstreamTLS tlsauth.TLS
	// Brokers are Kafka bootstrap addresses. Default: ["127.0.0.1:9092"].
	Brokers []string
	// KafkaTLS and KafkaSASL secure the connections to Brokers. Default: off.
	KafkaTLS  tlsauth.TLS
	KafkaSASL tlsauth.SASL
	// Topic receives the changefeed. It may be a topic expression holding {schema}
	// (TiCDC's topic dispatcher, topic = "parity_{schema}"): each schema's row events and
	// DDLs then go to its own topic, the schema's name substituted as TiCDC does, and
	// every resolved ts to every partition of every topic, as TiCDC broadcasts it. Any
	// other placeholder ({table} included) is an error. Default: "parity".
	Topic string
	// Partitions is the partition count loadgen creates a topic with when it does not
	// exist (TiCDC's partition-num); an existing topic keeps its partitions. 0 requires
	// the topics to exist. Default: 3.
	Partitions int
	// Reset drops the schemas (Database or Databases) on the upstream (and on Downstream
	// when set) before starting, so a demo can be re-run. Default: false.
	Reset bool
	// Database is the schema the tables live in, on both sides. Default: "parity_load".
	Database string
	// Databases, when set, replaces Database: several schemas, each with the same
	// tables; a transaction may change tables of several schemas (MultiTable), and the
	// import (ImportRows) fills and copies every schema at the one import TSO. With a
	// {schema} Topic each schema has its own topic. Default: nil (Database alone).
	Databases []string

	// Tables is the number of sysbench tables sbtest1..N. Default: 4.
	Tables int
	// IDType is the type of the sysbench id column, "int" or "bigint". Default: "int".
	IDType string
	// AllTypes adds the table `alltypes` with a column of every type. Default: true.
	AllTypes bool
	// Keyless adds the table `keyless` without primary or unique key. Default: true.
	Keyless bool

	// ImportRows, when > 0, fills every table with this many rows on TiDB, reads them back
	// at one TSO (the import TSO) and writes them to Downstream, creating the schema there,
	// as dumpling + an import would. The changefeed then starts at the import TSO: no DDL
	// events, and only transactions committed after it. Default: 0 (no import; the
	// changefeed carries the CREATE TABLE DDLs).
	ImportRows int
	// ImportTSFile, when set, receives the import TSO as a decimal line. Default: "".
	ImportTSFile string

	// Dispatcher is TiCDC's partition rule: "table" or "index-value". Default: "table".
	Dispatcher string
	// Workers is the number of concurrent TiDB sessions running transactions. Default: 4.
	Workers int
	// Rate caps committed transactions per second over all workers; 0 means no cap. Default: 0.
	Rate float64
	// Duration stops the workload after this long; 0 means no time limit. Default: 0.
	Duration time.Duration
	// Transactions stops the workload after this many committed transactions; 0 means no
	// limit. With neither Duration nor Transactions it runs until its context ends. Default: 0.
	Transactions int
	// RowsPerTxn is the most row changes per table in one transaction. Default: 4.
	RowsPerTxn int
	// MultiTable is the probability that a transaction changes 2 or 3 tables. Default: 0.2.
	MultiTable float64
	// InsertWeight, UpdateWeight and DeleteWeight set the mix of row changes. Default: 3, 5, 2.
	InsertWeight, UpdateWeight, DeleteWeight int
	// PKUpdate is the fraction of updates that change the primary key. Default: 0.1.
	PKUpdate float64
	// RawPKUpdates sends a primary-key-changing update as one update event (old row in
	// "p") instead of TiCDC's default split into a delete and an insert. Default: false.
	RawPKUpdates bool

	// CheckImages re-reads the rows of every committed transaction on TiDB at its commit
	// ts and stops the run, naming the table, key and commit ts, when a published image
	// (read inside the transaction) differs from what TiDB holds there: the changefeed
	// would then carry a change TiDB never made, and a fallback fed by it would diverge
	// from TiDB. One extra read per transaction. Default: false.
	CheckImages bool

	// FlushInterval is how often committed transactions are published. Default: 10ms.
	FlushInterval time.Duration
	// ResolvedInterval is how often a resolved ts is broadcast (TiCDC: about 1 s). Default: 1s.
	ResolvedInterval time.Duration
	// Heartbeat keeps Run publishing a resolved ts (TiDB's current TSO) every
	// ResolvedInterval after a workload that ended by Duration or Transactions, until ctx
	// ends, as TiCDC keeps a changefeed's resolved ts moving while TiDB is idle: a
	// consumer waiting for TiDB's current TSO (parity wait-applied --now) then sees it
	// resolved. A workload stopped by ctx has no heartbeat. Default: false (Run returns
	// when the workload ends).
	Heartbeat bool
	// WorkloadEnded, when set, is called with the workload's result once its final
	// resolved ts is published, before the heartbeat starts (only with Heartbeat).
	// Default: nil.
	WorkloadEnded func(Result)
	// TimeZone is the session time zone of TIMESTAMP values on both sides; the applier
	// must use the same one (TiCDC's --tz). Default: "+00:00".
	TimeZone string
	// Protocol is the changefeed's protocol, as TiCDC names it: "open-protocol",
	// "canal-json" (with the TiDB extension: commit ts, watermarks; DDLs to partition 0
	// only) or "simple" (JSON, BOOTSTRAP messages, TiCDC's row checksums; TimeZone must
	// then have a zone name, which TIMESTAMP values carry). canal-json and simple take no
	// Encoder compression or large-message handling. Default: "open-protocol".
	Protocol string
	// Encoder configures the open-protocol encoder (max-batch-size, max-message-bytes,
	// compression). Default: open.DefaultEncoderConfig().
	Encoder open.EncoderConfig
	// Seed seeds the random choices; 0 picks one. Default: 0.
	Seed uint64
	// Logger receives progress; nil discards it. Default: nil.
	Logger *slog.Logger
	// ProgressInterval is how often progress is logged. Default: 5s.
	ProgressInterval time.Duration
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		Upstream:         "root@tcp(127.0.0.1:4000)/",
		Brokers:          []string{"127.0.0.1:9092"},
		Topic:            "parity",
		Partitions:       3,
		Database:         "parity_load",
		Tables:           4,
		IDType:           "int",
		AllTypes:         true,
		Keyless:          true,
		Dispatcher:       DispatchTable,
		Workers:          4,
		RowsPerTxn:       4,
		MultiTable:       0.2,
		InsertWeight:     3,
		UpdateWeight:     5,
		DeleteWeight:     2,
		PKUpdate:         0.1,
		FlushInterval:    10 * time.Millisecond,
		ResolvedInterval: time.Second,
		TimeZone:         "+00:00",
		Protocol:         ProtocolOpen,
		Encoder:          open.DefaultEncoderConfig(),
		ProgressInterval: 5 * time.Second,
	}
}

// Validate reports every problem with the configuration, each with its key.
func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	if _, err := mysql.ParseDSN(c.Upstream); err != nil || c.Upstream == "" {
		bad("upstream", "invalid DSN: %v", err)
	}
	if c.ImportRows > 0 {
		if c.Downstream == "" {
			bad("downstream", "required with import-rows > 0")
		} else if _, err := mysql.ParseDSN(c.Downstream); err != nil {
			bad("downstream", "invalid DSN: %v", err)
		}
	}
	if c.ImportRows < 0 {
		bad("import-rows", "must not be negative, got %d", c.ImportRows)
	}
	if len(c.Brokers) == 0 {
		bad("brokers", "at least one broker is required")
	}
	for _, e := range []error{c.UpstreamTLS.Validate("upstream-tls"), c.DownstreamTLS.Validate("downstream-tls"),
		c.KafkaTLS.Validate("kafka-tls"), c.KafkaSASL.Validate("kafka-sasl", c.KafkaTLS.On())} {
		if e != nil {
			errs = append(errs, e)
		}
	}
	if err := validateTopic(c.Topic); err != nil {
		bad("topic", "%v", err)
	}
	if c.Partitions < 0 {
		bad("partitions", "must not be negative, got %d", c.Partitions)
	}
	if len(c.Databases) == 0 && c.Database == "" {
		bad("database", "required")
	}
	seen := map[string]int{}
	for i, db := range c.Databases {
		key := fmt.Sprintf("databases[%d]", i)
		switch {
		case db == "":
			bad(key, "empty schema name")
		case len(db) > 64:
			bad(key, "schema name %q is longer than 64 characters", db)
		case strings.HasSuffix(db, " "):
			bad(key, "schema name %q ends with a space", db)
		}
		// TiDB compares schema names case-insensitively: two spellings are one schema.
		if j, dup := seen[strings.ToLower(db)]; dup && db != "" {
			bad(key, "schema %q is also databases[%d]", db, j)
		} else {
			seen[strings.ToLower(db)] = i
		}
	}
	if c.Tables < 0 {
		bad("tables", "must not be negative, got %d", c.Tables)
	}
	if c.Tables == 0 && !c.AllTypes && !c.Keyless {
		bad("tables", "no tables: set tables > 0 or enable all-types or keyless")
	}
	switch strings.ToLower(c.IDType) {
	case "int", "bigint":
	default:
		bad("id-type", "want int or bigint, got %q", c.IDType)
	}
	if _, err := NewDispatcher(c.Dispatcher); err != nil {
		bad("dispatcher", "%v", err)
	}
	if c.Workers <= 0 {
		bad("workers", "must be positive, got %d", c.Workers)
	}
	if c.Rate < 0 {
		bad("rate", "must not be negative, got %v", c.Rate)
	}
	if c.Duration < 0 {
		bad("duration", "must not be negative, got %v", c.Duration)
	}
	if c.Transactions < 0 {
		bad("transactions", "must not be negative, got %d", c.Transactions)
	}
	if c.RowsPerTxn <= 0 {
		bad("rows-per-txn", "must be positive, got %d", c.RowsPerTxn)
	}
	if c.MultiTable < 0 || c.MultiTable > 1 {
		bad("multi-table", "must be within [0, 1], got %v", c.MultiTable)
	}
	if c.InsertWeight < 0 || c.UpdateWeight < 0 || c.DeleteWeight < 0 || c.InsertWeight+c.UpdateWeight+c.DeleteWeight == 0 {
		bad("insert-weight/update-weight/delete-weight", "must not be negative and not all zero, got %d/%d/%d",
			c.InsertWeight, c.UpdateWeight, c.DeleteWeight)
	}
	if c.PKUpdate < 0 || c.PKUpdate > 1 {
		bad("pk-update", "must be within [0, 1], got %v", c.PKUpdate)
	}
	if c.FlushInterval <= 0 {
		bad("flush-interval", "must be positive, got %v", c.FlushInterval)
	}
	if c.ResolvedInterval <= 0 {
		bad("resolved-interval", "must be positive, got %v", c.ResolvedInterval)
	}
	if c.TimeZone == "" {
		bad("time-zone", "required")
	}
	if err := c.Encoder.Validate(); err != nil {
		bad("encoder", "%v", err)
	}
	if err := validateProtocol(c.Protocol, c.Encoder, c.TimeZone); err != nil {
		bad("protocol", "%v", err)
	}
	if c.ProgressInterval <= 0 {
		bad("progress-interval", "must be positive, got %v", c.ProgressInterval)
	}
	return errors.Join(errs...)
}

// Schemas returns the schemas the generator writes: Databases, or Database alone.
func (c *Config) Schemas() []string {
	if len(c.Databases) > 0 {
		return c.Databases
	}
	return []string{c.Database}
}

// TopicOf returns the topic a schema's changes go to: Topic, or with {schema} in Topic
// the schema's own topic (its name substituted as TiCDC does).
func (c *Config) TopicOf(schema string) string { return topicFor(c.Topic, schema) }

// Topics returns the distinct topics of Schemas, in the order of their first schema.
func (c *Config) Topics() []string {
	var out []string
	for _, s := range c.Schemas() {
		if t := c.TopicOf(s); !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// Result summarises a run.
type Result struct {
	// ImportTs is the TSO the import read TiDB at (0 without import).
	ImportTs uint64
	// StartTs is where the changefeed starts: the import TSO, or the ts of the DDLs.
	StartTs uint64
	// ResolvedTs is the last resolved ts published: TiDB at this TSO is what the fallback
	// must equal once everything is applied.
	ResolvedTs uint64
	// Transactions published, row events, Kafka records (rows, DDL and resolved), and
	// transactions rolled back after a lock conflict.
	Transactions, Rows, Records, Aborted int64
}
