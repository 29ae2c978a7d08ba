package bypass

import (
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Config configures a Detector. The TOML keys are the kebab-case names in the struct
// tags, under [bypass] in `parity serve`'s file; Validate reports problems with those
// key paths.
type Config struct {
	// Enabled reads the fallback's binlog and records every change of a replicated
	// table that parity did not write. The fallback needs log_bin with
	// binlog_format=ROW, and the downstream user REPLICATION SLAVE (MariaDB: also
	// BINLOG MONITOR or REPLICATION CLIENT, to read the binlog's current position).
	// Default: false
	Enabled bool `toml:"enabled"`
	// ServerID is the server id the detector's binlog client registers with, as a
	// replica would: it must differ from every server and replica of the fallback's
	// topology (a second client with the same id disconnects the first). The daemons of
	// one changefeed under [ha] share it: only the one holding the lease reads.
	// Default: 4231
	ServerID uint32 `toml:"server-id"`
	// Schemas are the downstream schemas whose tables are replicated (watched).
	// Default: [] (every schema except mysql, information_schema, performance_schema,
	// sys and parity's meta schemas)
	Schemas []string `toml:"schemas"`
	// Retention is how long detections are kept in <meta>.bypass_writes.
	// Default: 720h (30 days)
	Retention time.Duration `toml:"retention"`
	// SaveInterval is how often the binlog position is saved when nothing was
	// detected (detections are saved, with the position, as soon as their transaction
	// is read): a restart re-reads at most this much binlog.
	// Default: 1s
	SaveInterval time.Duration `toml:"save-interval"`
	// QueryTimeout bounds every query of the detector.
	// Default: 30s
	QueryTimeout time.Duration `toml:"query-timeout"`
	// ReconnectBackoff is the first wait before reading the binlog again after the
	// connection broke (a restart of the fallback); it doubles up to 30s.
	// Default: 1s
	ReconnectBackoff time.Duration `toml:"reconnect-backoff"`

	// Set by the caller from the applier's configuration (not TOML keys).
	DSN        string `toml:"-"` // the fallback (downstream.dsn)
	MetaSchema string `toml:"-"` // applier.meta-schema
	Changefeed string `toml:"-"` // changefeed.id

	// checked is set by Checked: New takes the config as it is.
	checked bool
}

// Checked validates c (key paths under "bypass.") and returns it marked, so that New
// does not validate it again (the daemon checks its configuration once).
func (c Config) Checked() (Config, error) {
	if c.checked {
		return c, nil
	}
	if err := c.Validate("bypass."); err != nil {
		return c, err
	}
	c.checked = true
	return c, nil
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		ServerID:         4231,
		Schemas:          []string{},
		Retention:        720 * time.Hour,
		SaveInterval:     time.Second,
		QueryTimeout:     30 * time.Second,
		ReconnectBackoff: time.Second,
	}
}

// Validate reports every problem, each with its key path (under prefix, e.g. "bypass.").
func (c Config) Validate(prefix string) error {
	if !c.Enabled {
		return nil
	}
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s%s: %s", prefix, key, fmt.Sprintf(format, args...)))
	}
	if c.ServerID == 0 {
		bad("server-id", "must be > 0 (a binlog client needs a server id)")
	}
	for i, s := range c.Schemas {
		if s == "" {
			bad(fmt.Sprintf("schemas[%d]", i), "empty schema name")
		}
	}
	if c.Retention <= 0 {
		bad("retention", "must be > 0, got %v", c.Retention)
	}
	if c.SaveInterval <= 0 {
		bad("save-interval", "must be > 0, got %v", c.SaveInterval)
	}
	if c.QueryTimeout <= 0 {
		bad("query-timeout", "must be > 0, got %v", c.QueryTimeout)
	}
	if c.ReconnectBackoff <= 0 {
		bad("reconnect-backoff", "must be > 0, got %v", c.ReconnectBackoff)
	}
	if c.DSN == "" {
		errs = append(errs, errors.New("downstream.dsn: required to read the fallback's binlog"))
	} else if mc, err := mysql.ParseDSN(c.DSN); err != nil {
		errs = append(errs, fmt.Errorf("downstream.dsn: %w", err))
	} else if mc.Net != "tcp" && mc.Net != "" {
		errs = append(errs, fmt.Errorf("downstream.dsn: the binlog client connects over tcp, not %q", mc.Net))
	}
	if c.MetaSchema == "" {
		errs = append(errs, errors.New("applier.meta-schema: required"))
	}
	return errors.Join(errs...)
}
