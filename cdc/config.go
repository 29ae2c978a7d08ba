package cdc

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/tlsauth"
)

// Config configures a Replicator: where the changefeed comes from, where it is applied
// and how. The TOML keys are the kebab-case names in the struct tags; Validate reports
// problems with those key paths.
type Config struct {
	// Changefeed is the TiCDC changefeed as it appears in Kafka.
	Changefeed ChangefeedConfig `toml:"changefeed"`
	// Upstream is the TiDB the changefeed comes from, read only to complete
	// handle-key-only events.
	Upstream UpstreamConfig `toml:"upstream"`
	// Downstream is the fallback MySQL the changefeed is applied to.
	Downstream DownstreamConfig `toml:"downstream"`
	// Applier tunes buffering, spilling and applying.
	Applier ApplierConfig `toml:"applier"`
	// HA runs the replicator as the active or a standby one of several daemons
	// configured for the same changefeed and fallback (see ha.go).
	HA HAConfig `toml:"ha"`

	// checked is set by Checked: New takes the config as it is.
	checked bool
}

// Checked validates c, applies its TLS settings to the DSNs (WithTLS) and returns it
// marked, so that New does not validate it again: the daemon checks its configuration
// once and hands each component its part checked.
func (c Config) Checked() (Config, error) {
	if c.checked {
		return c, nil
	}
	if err := c.Validate(); err != nil {
		return c, err
	}
	c, err := c.WithTLS()
	if err != nil {
		return c, err
	}
	c.checked = true
	return c, nil
}

// ChangefeedConfig describes the Kafka side of the changefeed.
type ChangefeedConfig struct {
	// ID names the changefeed in the meta schema; two replicators with different IDs can
	// share one meta schema.
	// Default: "default"
	ID string `toml:"id"`
	// Brokers are the Kafka bootstrap addresses (host:port).
	// Default: none (required)
	Brokers []string `toml:"brokers"`
	// Topics are the topics of the changefeed; every partition of every topic is read.
	// Default: none (set topics or topic-regex)
	Topics []string `toml:"topics"`
	// TopicRegex selects the changefeed's topics by name at start-up (anchored).
	// Default: "" (use topics)
	TopicRegex string `toml:"topic-regex"`
	// Protocol is the changefeed's protocol, by TiCDC's name (the sink URI's protocol=):
	// "open-protocol", "canal-json" (created with enable-tidb-extension=true) or
	// "simple". Avro and Debezium are refused: they carry no watermark, which an
	// exactly-once, commit-ordered applier needs (docs/serve.md, the protocol table).
	// Default: "open-protocol"
	Protocol string `toml:"protocol"`
	// Compression is TiCDC's large-message-handle-compression: none, snappy or lz4.
	// Default: "none"
	Compression string `toml:"compression"`
	// TimeZone is the TiCDC server's --tz, in which TIMESTAMP values are rendered; the
	// apply sessions use it as time_zone. "UTC", "+08:00" or a zone name the downstream
	// knows.
	// Default: "UTC"
	TimeZone string `toml:"time-zone"`
	// ClaimCheckDir is the local directory (or mounted bucket) holding claim-check files.
	// Default: "" (claim-check messages are a decode error)
	ClaimCheckDir string `toml:"claim-check-dir"`
	// SchemaMap renames upstream schemas downstream ({"app" = "app_fallback"}): the
	// rows' tables, and every schema a DDL names (its tables, databases, indexes' tables,
	// foreign-key references, LIKE sources, RENAME targets). Unqualified names in a DDL
	// run with the mapped schema as the default database.
	// Default: {} (same names)
	SchemaMap map[string]string `toml:"schema-map"`
	// StartTs is the applied checkpoint assumed at the very first start, when the meta
	// schema has none: typically the TSO of the import that loaded the fallback (the
	// changefeed's start-ts). Events at or below it are skipped. Ignored once a
	// checkpoint exists.
	// Default: 0
	StartTs uint64 `toml:"start-ts"`
	// MaxMessageBytes bounds one decompressed payload (a defence against corrupt input).
	// Default: 0 (the codec's default)
	MaxMessageBytes int `toml:"max-message-bytes"`
	// TLS encrypts every connection to the brokers ([changefeed.tls]: ca-file,
	// cert-file, key-file, server-name, insecure-skip-verify; docs/security.md).
	// Default: off (plaintext)
	TLS tlsauth.TLS `toml:"tls"`
	// SASL authenticates every connection to the brokers ([changefeed.sasl]: mechanism
	// plain, scram-sha-256 or scram-sha-512, username, password or password-file).
	// Default: off (no authentication)
	SASL tlsauth.SASL `toml:"sasl"`
	// RetryTimeout is how long reading a partition may keep failing with transient
	// errors (the broker unreachable, restarting or resetting connections) before the
	// applier stops with an error; until then the reader reconnects with backoff and
	// continues from the next offset. A protocol error (an offset out of range) stops
	// it at once.
	// Default: 2m
	RetryTimeout time.Duration `toml:"retry-timeout"`
}

// UpstreamConfig is the upstream TiDB.
type UpstreamConfig struct {
	// DSN is a go-sql-driver/mysql DSN of the upstream TiDB (user:pass@tcp(host:port)/).
	// With it, row events that TiCDC sent with their handle key only (the changefeed's
	// large-message-handle-option = "handle-key-only", for rows over max-message-bytes)
	// are completed by reading the row at the event's commit ts (@@tidb_snapshot); the
	// user needs SELECT on the replicated tables, and TiDB's GC must keep versions as old
	// as the changefeed's lag. The env var PARITY_UPSTREAM_DSN overrides it in
	// `parity serve`.
	// Default: "" (a handle-key-only insert or update stops the applier)
	DSN string `toml:"dsn"`
	// TLS encrypts the connections to the upstream ([upstream.tls]: ca-file, cert-file,
	// key-file, server-name, insecure-skip-verify; docs/security.md).
	// Default: off (the DSN's own tls parameter, if any)
	TLS tlsauth.TLS `toml:"tls"`
}

// DownstreamConfig is the fallback MySQL.
type DownstreamConfig struct {
	// DSN is a go-sql-driver/mysql DSN (user:pass@tcp(host:port)/). The database part is
	// ignored; the env var PARITY_DOWNSTREAM_DSN overrides it in `parity serve`.
	// Default: none (required)
	DSN string `toml:"dsn"`
	// TLS encrypts the connections to the fallback ([downstream.tls]: ca-file,
	// cert-file, key-file, server-name, insecure-skip-verify; docs/security.md).
	// Default: off (the DSN's own tls parameter, if any)
	TLS tlsauth.TLS `toml:"tls"`
}

// ApplierConfig tunes how the changefeed is buffered and applied.
type ApplierConfig struct {
	// Workers is the number of downstream connections applying rows in parallel.
	// Default: 8
	Workers int `toml:"workers"`
	// BatchRows is the most rows in one multi-row statement.
	// Default: 256
	BatchRows int `toml:"batch-rows"`
	// TxnRows is the most rows one worker writes in one transaction: its statements of a
	// round share one transaction (one marker, one fence, one COMMIT) until this many
	// rows (or 32 MiB of values), then the next transaction starts.
	// Default: 4096
	TxnRows int `toml:"txn-rows"`
	// LoadData writes upserts whose columns allow it with LOAD DATA LOCAL INFILE ...
	// REPLACE instead of INSERT ... ON DUPLICATE KEY UPDATE: the same rows, for about a
	// quarter less of the fallback's CPU (docs/serve.md). Used only when the fallback's
	// local_infile is ON; a table with triggers, or whose columns include YEAR, ENUM,
	// SET, BIT, floats, binary strings or JSON, is written with INSERT.
	// Default: true
	LoadData bool `toml:"load-data"`
	// LoadRows is the most rows in one LOAD DATA statement (see LoadData); BatchRows
	// bounds the other statements.
	// Default: 1024
	LoadRows int `toml:"load-rows"`
	// MemoryBytes bounds the row events held in memory while they wait for the resolved
	// ts; beyond it, buffered rows spill to SpillDir.
	// Default: 268435456 (256 MiB)
	MemoryBytes int64 `toml:"memory-bytes"`
	// SpillDir is the local directory for spilled rows; emptied at start.
	// Default: "" (a "parity-spill-<changefeed>" directory under the system temp dir)
	SpillDir string `toml:"spill-dir"`
	// MetaSchema is the downstream schema holding parity's checkpoint, offsets, applied
	// DDLs and dead letters. Created and migrated by parity.
	// Default: "parity_meta"
	MetaSchema string `toml:"meta-schema"`
	// DeadLetter copies a record that cannot be decoded into <meta-schema>.dead_letter and
	// continues; when false such a record stops the applier at its offset.
	// Default: false
	DeadLetter bool `toml:"dead-letter"`
	// MaxRetries is how often a transient downstream error (deadlock, lock wait timeout,
	// lost connection) is retried before the applier stops.
	// Default: 10
	MaxRetries int `toml:"max-retries"`
	// RetryBackoff is the first retry delay; it doubles up to 5s.
	// Default: 100ms
	RetryBackoff time.Duration `toml:"retry-backoff"`
	// QueryTimeout bounds every downstream statement.
	// Default: 60s
	QueryTimeout time.Duration `toml:"query-timeout"`
	// SQLMode, when set, is the sql_mode of the apply sessions (e.g. a mode without
	// NO_ZERO_DATE when the upstream holds zero dates and the downstream's default
	// rejects them).
	// Default: "" (the downstream's default)
	SQLMode string `toml:"sql-mode"`
	// DDLTimeout bounds one DDL statement.
	// Default: 1h
	DDLTimeout time.Duration `toml:"ddl-timeout"`
	// GCPercent is Go's GOGC while the replicator runs: the heap may grow by this
	// percentage of live data between collections. Decoding the changefeed allocates
	// much; a higher value spends less CPU collecting (CPU the downstream may share) and
	// more memory. The heap is also capped by a soft limit of 2 × memory-bytes + 32 MiB
	// (at least 128 MiB; Go's GOMEMLIMIT), inside the peak-RSS plan of
	// 2 × memory-bytes + 64 MiB. 0 leaves the Go runtime's settings alone, as does a
	// GOGC or GOMEMLIMIT environment variable. The settings are process-wide.
	// Default: 400
	GCPercent int `toml:"gc-percent"`
	// Ledger records, in <meta-schema>.dirty_keys, which keys of which tables every
	// round changed and the commit ts of each key's last change (internal/ledger): the
	// scopes and classification of verification read it. Off, the applier writes a
	// little less and verification can only compare whole tables.
	// Default: true
	Ledger bool `toml:"ledger"`
	// LedgerRetention is how long ledger rows and ts-map rows are kept (by the commit
	// ts they cover); older ones are deleted as the applier goes.
	// Default: 168h (7 days)
	LedgerRetention time.Duration `toml:"ledger-retention"`
	// TSMapInterval is how often the applier records, in <meta-schema>.ts_map, the
	// upstream TSO the fallback is at together with the fallback's own position (GTID
	// set or binlog file:position) and the wall time, so other tools can align the two
	// sides. 0 disables it. Not a key of the [applier] section: parity serve sets it
	// from verify.ts-map-interval, next to the pairs verification records in the same
	// table.
	// Default: 1m
	TSMapInterval time.Duration `toml:"-"`
	// TypeMap maps a TiDB column type the fallback lacks to a type it has, by the
	// lower-case name of the TiDB type (vector, json, bit, varchar, ...): DDL that
	// defines a column of that type defines it with the given type instead (the column's
	// NOT NULL, DEFAULT and COMMENT are kept). Entries add to, or replace, the built-in
	// map { vector = "LONGTEXT" }. The value is a column type as MySQL writes it
	// ("LONGTEXT", "VARCHAR(4000)", "JSON"); rows are written as TiCDC carries them
	// (a VECTOR as its text, "[1,2,3]").
	// Default: {} (the built-in map only)
	TypeMap map[string]string `toml:"type-map"`
	// SkipDDL lists DDLs that are recorded (ddl_applied.skipped) and logged at warn
	// instead of run downstream: the way past a DDL the fallback rejects. An entry
	// matches by commit-ts, by pattern, or by both when both are set.
	// Default: [] (none)
	SkipDDL []SkipDDL `toml:"skip-ddl"`
}

// SkipDDL selects DDLs to skip (applier.skip-ddl).
type SkipDDL struct {
	// CommitTs matches the DDL with this commit ts (the error of a rejected DDL names
	// it).
	// Default: 0 (any commit ts; then pattern is required)
	CommitTs uint64 `toml:"commit-ts"`
	// Pattern is a regular expression (Go RE2, unanchored; (?i) for any case) matched
	// against the DDL's query as TiCDC sent it.
	// Default: "" (any query; then commit-ts is required)
	Pattern string `toml:"pattern"`
}

// The changefeed protocols parity consumes, by TiCDC's names.
const (
	ProtocolOpen   = "open-protocol"
	ProtocolCanal  = "canal-json"
	ProtocolSimple = "simple"
)

// validProtocol accepts TiCDC's protocols parity can apply exactly once and says why the
// others cannot be.
func validProtocol(p string) error {
	switch p {
	case ProtocolOpen, ProtocolCanal, ProtocolSimple:
		return nil
	case "avro", "debezium", "canal", "maxwell":
		return fmt.Errorf("%q carries no watermark (resolved ts): parity cannot tell when every row up to a commit ts has arrived, so it cannot apply the changefeed exactly once in commit-ts order; create the changefeed with protocol=open-protocol, canal-json (enable-tidb-extension=true) or simple", p)
	case "":
		return errors.New("required")
	}
	return fmt.Errorf("unknown protocol %q (open-protocol, canal-json or simple)", p)
}

// DefaultConfig returns the defaults documented on each field.
func DefaultConfig() Config {
	return Config{
		Changefeed: ChangefeedConfig{
			ID:           "default",
			Protocol:     ProtocolOpen,
			Compression:  "none",
			TimeZone:     "UTC",
			SchemaMap:    map[string]string{},
			RetryTimeout: 2 * time.Minute,
		},
		Applier: ApplierConfig{
			Workers:         8,
			BatchRows:       256,
			TxnRows:         4096,
			LoadData:        true,
			LoadRows:        1024,
			MemoryBytes:     256 << 20,
			MetaSchema:      "parity_meta",
			MaxRetries:      10,
			RetryBackoff:    100 * time.Millisecond,
			QueryTimeout:    60 * time.Second,
			DDLTimeout:      time.Hour,
			GCPercent:       400,
			TypeMap:         map[string]string{},
			Ledger:          true,
			LedgerRetention: 7 * 24 * time.Hour,
			TSMapInterval:   time.Minute,
		},
		HA: DefaultHAConfig(),
	}
}

var (
	identRe   = regexp.MustCompile(`^[A-Za-z0-9_$]{1,64}$`)
	tzRe      = regexp.MustCompile(`^[+-](0\d|1[0-4]):[0-5]\d$`)
	sqlModeRe = regexp.MustCompile(`^[A-Za-z_,]*$`)
)

// Validate reports every problem of c, each prefixed with its TOML key path.
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, a...)))
	}
	cf := c.Changefeed
	if cf.ID == "" {
		bad("changefeed.id", "required")
	} else if len(cf.ID) > 128 {
		bad("changefeed.id", "longer than 128 bytes")
	}
	if len(cf.Brokers) == 0 {
		bad("changefeed.brokers", "required")
	}
	for i, b := range cf.Brokers {
		if !strings.Contains(b, ":") {
			bad(fmt.Sprintf("changefeed.brokers[%d]", i), "%q is not host:port", b)
		}
	}
	switch {
	case len(cf.Topics) == 0 && cf.TopicRegex == "":
		bad("changefeed.topics", "set topics or topic-regex")
	case len(cf.Topics) > 0 && cf.TopicRegex != "":
		bad("changefeed.topic-regex", "set topics or topic-regex, not both")
	}
	for i, t := range cf.Topics {
		if t == "" {
			bad(fmt.Sprintf("changefeed.topics[%d]", i), "empty topic name")
		}
	}
	if cf.TopicRegex != "" {
		if _, err := regexp.Compile(cf.TopicRegex); err != nil {
			bad("changefeed.topic-regex", "%v", err)
		}
	}
	if err := validProtocol(cf.Protocol); err != nil {
		bad("changefeed.protocol", "%v", err)
	}
	if err := open.Compression(cf.Compression).Validate(); err != nil {
		bad("changefeed.compression", "%v", err)
	} else if cf.Protocol != ProtocolOpen && cf.Protocol != "" && open.Compression(cf.Compression) != open.CompressionNone {
		bad("changefeed.compression", "%q applies to the open protocol only (protocol %q)", cf.Compression, cf.Protocol)
	}
	if _, err := sessionTimeZone(cf.TimeZone); err != nil {
		bad("changefeed.time-zone", "%v", err)
	}
	if cf.ClaimCheckDir != "" {
		if st, err := os.Stat(cf.ClaimCheckDir); err != nil || !st.IsDir() {
			bad("changefeed.claim-check-dir", "%q is not a directory", cf.ClaimCheckDir)
		}
	}
	for up, down := range cf.SchemaMap {
		if up == "" || down == "" {
			bad("changefeed.schema-map", "empty schema name in %q = %q", up, down)
		}
	}
	if cf.RetryTimeout < 0 {
		bad("changefeed.retry-timeout", "must not be negative")
	}
	if cf.MaxMessageBytes < 0 {
		bad("changefeed.max-message-bytes", "must not be negative")
	}
	if err := cf.TLS.Validate("changefeed.tls"); err != nil {
		errs = append(errs, err)
	}
	if err := cf.SASL.Validate("changefeed.sasl", cf.TLS.On()); err != nil {
		errs = append(errs, err)
	}

	if c.Upstream.DSN != "" {
		if _, err := mysql.ParseDSN(c.Upstream.DSN); err != nil {
			bad("upstream.dsn", "%v", err)
		}
	} else if c.Upstream.TLS.On() {
		bad("upstream.tls", "needs upstream.dsn")
	}
	if c.Downstream.DSN == "" {
		bad("downstream.dsn", "required")
	} else if _, err := mysql.ParseDSN(c.Downstream.DSN); err != nil {
		bad("downstream.dsn", "%v", err)
	}
	for _, e := range []error{
		c.Upstream.TLS.Validate("upstream.tls"), c.Upstream.TLS.ValidateDSN("upstream.tls", c.Upstream.DSN),
		c.Downstream.TLS.Validate("downstream.tls"), c.Downstream.TLS.ValidateDSN("downstream.tls", c.Downstream.DSN),
	} {
		if e != nil {
			errs = append(errs, e)
		}
	}

	a := c.Applier
	if a.Workers < 1 || a.Workers > 256 {
		bad("applier.workers", "must be between 1 and 256, got %d", a.Workers)
	}
	if a.BatchRows < 1 || a.BatchRows > 10000 {
		bad("applier.batch-rows", "must be between 1 and 10000, got %d", a.BatchRows)
	}
	if a.LoadRows < 1 || a.LoadRows > 100000 {
		bad("applier.load-rows", "must be between 1 and 100000, got %d", a.LoadRows)
	}
	if a.TxnRows < 1 || a.TxnRows > 1000000 {
		bad("applier.txn-rows", "must be between 1 and 1000000, got %d", a.TxnRows)
	}
	if a.MemoryBytes < 1<<10 {
		bad("applier.memory-bytes", "must be at least 1024, got %d", a.MemoryBytes)
	}
	if !identRe.MatchString(a.MetaSchema) {
		bad("applier.meta-schema", "%q is not a plain identifier", a.MetaSchema)
	}
	if a.MaxRetries < 0 {
		bad("applier.max-retries", "must not be negative")
	}
	if a.RetryBackoff <= 0 {
		bad("applier.retry-backoff", "must be positive")
	}
	if a.QueryTimeout <= 0 {
		bad("applier.query-timeout", "must be positive")
	}
	if !sqlModeRe.MatchString(a.SQLMode) {
		bad("applier.sql-mode", "%q is not a comma-separated list of modes", a.SQLMode)
	}
	if a.DDLTimeout <= 0 {
		bad("applier.ddl-timeout", "must be positive")
	}
	if a.LedgerRetention < time.Hour {
		bad("applier.ledger-retention", "must be at least 1h, got %v", a.LedgerRetention)
	}
	if a.TSMapInterval < 0 || (a.TSMapInterval > 0 && a.TSMapInterval < time.Second) {
		bad("verify.ts-map-interval", "must be 0 (off) or at least 1s, got %v", a.TSMapInterval)
	}
	if a.GCPercent < 0 || a.GCPercent > 10000 {
		bad("applier.gc-percent", "must be between 0 and 10000, got %d", a.GCPercent)
	}
	seenType := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(a.TypeMap)) {
		key := "applier.type-map." + name
		if prev, ok := seenType[strings.ToLower(name)]; ok {
			bad(key, "same type as applier.type-map.%s", prev)
		}
		seenType[strings.ToLower(name)] = name
		if !knownTypeName(name) {
			bad(key, "%q is not a TiDB column type name (want one of %s)", name, strings.Join(typeNames(), ", "))
		}
		if _, err := parseColumnType(a.TypeMap[name]); err != nil {
			bad(key, "%v", err)
		}
	}
	for i, s := range a.SkipDDL {
		key := fmt.Sprintf("applier.skip-ddl[%d]", i)
		if s.CommitTs == 0 && s.Pattern == "" {
			bad(key, "set commit-ts or pattern")
		}
		if s.Pattern != "" {
			if _, err := regexp.Compile(s.Pattern); err != nil {
				bad(key+".pattern", "%v", err)
			}
		}
	}
	errs = append(errs, c.HA.validate()...)
	return errors.Join(errs...)
}

// WithTLS returns c with [upstream.tls] and [downstream.tls] applied to their DSNs
// (tlsauth.DSN: a TLS config registered with the driver and named in the DSN) and those
// tables cleared, so whatever opens the returned DSNs (the applier, verification,
// repair, the API) connects with TLS. The certificate files are read now.
func (c Config) WithTLS() (Config, error) {
	var err error
	if c.Upstream.DSN != "" {
		if c.Upstream.DSN, err = tlsauth.DSN(c.Upstream.DSN, c.Upstream.TLS, "upstream.tls"); err != nil {
			return c, err
		}
	}
	if c.Downstream.DSN, err = tlsauth.DSN(c.Downstream.DSN, c.Downstream.TLS, "downstream.tls"); err != nil {
		return c, err
	}
	c.Upstream.TLS, c.Downstream.TLS = tlsauth.TLS{}, tlsauth.TLS{}
	return c, nil
}

// TLSWarnings are the warnings of c's TLS settings (certificates not verified).
func (c Config) TLSWarnings() []string {
	var w []string
	w = append(w, c.Changefeed.TLS.Warnings("changefeed.tls")...)
	w = append(w, c.Upstream.TLS.Warnings("upstream.tls")...)
	w = append(w, c.Downstream.TLS.Warnings("downstream.tls")...)
	return w
}

// gcLimit is the soft memory limit set with GCPercent: 2 × memory-bytes + 32 MiB, at
// least 128 MiB.
func (c Config) gcLimit() int64 {
	return max(2*c.Applier.MemoryBytes+32<<20, 128<<20)
}

// spillDir returns the configured spill directory or the default one.
func (c Config) spillDir() string {
	if c.Applier.SpillDir != "" {
		return c.Applier.SpillDir
	}
	return filepath.Join(os.TempDir(), "parity-spill-"+c.Changefeed.ID)
}

// targetSchema maps an upstream schema name to the downstream one.
func (c Config) targetSchema(s string) string {
	if t, ok := c.Changefeed.SchemaMap[s]; ok {
		return t
	}
	return s
}

// skipRule returns the applier.skip-ddl entry matching a DDL, described for the meta
// schema and the log ("" and false when none matches). Validate has checked the
// patterns.
func (a ApplierConfig) skipRule(commitTs uint64, query string) (string, bool) {
	for i, s := range a.SkipDDL {
		if s.CommitTs != 0 && s.CommitTs != commitTs {
			continue
		}
		if s.Pattern != "" {
			re, err := regexp.Compile(s.Pattern)
			if err != nil || !re.MatchString(query) {
				continue
			}
		}
		var by []string
		if s.CommitTs != 0 {
			by = append(by, fmt.Sprintf("commit-ts %d", s.CommitTs))
		}
		if s.Pattern != "" {
			by = append(by, fmt.Sprintf("pattern %q", s.Pattern))
		}
		return fmt.Sprintf("applier.skip-ddl[%d]: %s", i, strings.Join(by, " and ")), true
	}
	return "", false
}

// sessionTimeZone turns the configured zone into a time_zone value for SET.
func sessionTimeZone(tz string) (string, error) {
	switch {
	case tz == "" || strings.EqualFold(tz, "UTC") || tz == "Z":
		return "+00:00", nil
	case tzRe.MatchString(tz):
		return tz, nil
	case strings.EqualFold(tz, "SYSTEM"):
		return "SYSTEM", nil
	}
	if _, err := time.LoadLocation(tz); err != nil {
		return "", fmt.Errorf("unknown time zone %q (want UTC, +HH:MM or a zone name)", tz)
	}
	return tz, nil
}
