package verify

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/robfig/cron/v3"

	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/instance"
)

// Scopes of a run (checker.ParseScope): ScopeFull, ScopeCDC and "since:<TSO|time>",
// which read the dirty-key ledger.
const (
	ScopeFull = checker.ScopeFull
	ScopeCDC  = checker.ScopeCDC
)

// Triggers of a run, as the history and the metrics name them; a scheduled run is named
// after its schedule.
const (
	TriggerManual     = "manual"
	TriggerContinuous = "continuous"
)

// Config is the [verify] section of parity serve's configuration. Keys are reported
// with their full path (verify.max-view-age).
type Config struct {
	// Enabled runs verification inside parity serve, beside the applier.
	// Default: false
	Enabled bool `toml:"enabled"`
	// Tables are the upstream tables verified, "schema.table" with * and ? wildcards
	// (the meta schema and system schemas are never matched); the default of every
	// schedule and of manual and continuous runs.
	// Default: [] (required when enabled)
	Tables []string `toml:"tables"`
	// Exclude removes tables matched by Tables, same form.
	// Default: []
	Exclude []string `toml:"exclude"`
	// Scope of continuous runs and of manual runs that name none: "full" (every row),
	// "cdc" (the keys the changefeed changed since each table's last clean verification,
	// from the dirty-key ledger) or "since:<TSO|RFC 3339 time>" (the keys changed after
	// that point). A ledger-backed scope is refused for a table the ledger cannot vouch
	// for (never verified clean, or changed before the ledger starts): run a full
	// verification first.
	// Default: "full"
	Scope string `toml:"scope"`
	// CaughtUpLag classifies differences: a key last changed before the applier first
	// came within this lag of real time is "post-import", after it "cdc"
	// (checker's caught-up-lag).
	// Default: 30s
	CaughtUpLag time.Duration `toml:"caught-up-lag"`
	// MaxViewAge: a fallback read view (a snapshot pair's transactions) older than this
	// is never used; a run takes a new pair between tables once its pair is past half of
	// it, and a table still being compared when its pair reaches it goes on at a fresh
	// pair. Long-open views grow InnoDB's history list on the fallback. At least 1s.
	// Default: 10m
	MaxViewAge time.Duration `toml:"max-view-age"`
	// ContinuousInterval runs a continuous verification (trigger "continuous") this long
	// after the previous one ended. 0 disables it.
	// Default: 0
	ContinuousInterval time.Duration `toml:"continuous-interval"`
	// Schedules run verifications on cron schedules ([[verify.schedule]]).
	// Default: [] (none)
	Schedules []Schedule `toml:"schedule"`
	// MaxConcurrentRuns bounds the runs of every trigger running at once; a run waits
	// for a free slot (a schedule's next firing is skipped meanwhile).
	// Default: 1
	MaxConcurrentRuns int `toml:"max-concurrent-runs"`
	// MaxLag: while the applier's checkpoint is older than this, no pair is opened and
	// no new chunk started, so verification never holds replication further back. 0:
	// never pause.
	// Default: 1m
	MaxLag time.Duration `toml:"max-lag"`
	// MaxConnections is the connections (and so the concurrent chunk queries) of a run on
	// each side: the fallback's snapshot transactions and TiDB's snapshot sessions.
	// Default: 2
	MaxConnections int `toml:"max-connections"`
	// MaxRowsPerSecond caps the rows a run compares per second (0: no cap).
	// Default: 0
	MaxRowsPerSecond int `toml:"max-rows-per-second"`
	// MaxThreadsRunning pauses new chunks while the fallback's Threads_running, less the
	// run's own queries, is above it (0: never).
	// Default: 0
	MaxThreadsRunning int `toml:"max-threads-running"`
	// QueryTimeout bounds every query of a run.
	// Default: 5m
	QueryTimeout time.Duration `toml:"query-timeout"`
	// TSMapInterval is how often the applier records the upstream TSO the fallback is at
	// and the fallback's position in <meta-schema>.ts_map (every snapshot pair is
	// recorded there too); 0 disables the periodic rows. Applies when verification is
	// disabled too. Read (and validated) by the applier: the daemon passes it to cdc's
	// ApplierConfig.TSMapInterval.
	// Default: 1m
	TSMapInterval time.Duration `toml:"ts-map-interval"`
	// HistoryRetention: runs that ended longer ago than this are deleted from the
	// history (<meta-schema>.verify_runs, its pairs and tables) with the checker's rows
	// of those runs (their chunks and differences), checked every hour, so continuous
	// and scheduled runs do not grow the fallback's meta schema without bound. The
	// newest clean run over verify.tables is always kept (freshness starts from it);
	// tables' clean verifications (diff_verified) are never deleted. 0 keeps every run;
	// otherwise at least 1h.
	// Default: 2160h (90 days)
	HistoryRetention time.Duration `toml:"history-retention"`

	// Instance names this daemon among the daemons that verify the same changefeed on
	// the same fallback (active and standby): each fire of a schedule runs on the one
	// daemon that claims it first (<meta-schema>.verify_fires), and the history and
	// /status name the instance. Unique among them and stable across restarts when set:
	// a restarted daemon marks the runs its instance left running as interrupted. Empty:
	// "<hostname>:<pid>".
	// Default: ""
	Instance string `toml:"instance"`

	// Set by parity serve from its other sections, not from [verify].
	// Changefeed is changefeed.id. Default: none (required).
	Changefeed string `toml:"-"`
	// UpstreamDSN is upstream.dsn: TiDB, read at each pair's TSO. Default: none
	// (required when enabled).
	UpstreamDSN string `toml:"-"`
	// DownstreamDSN is downstream.dsn: the fallback. Default: none (required).
	DownstreamDSN string `toml:"-"`
	// MetaSchema is applier.meta-schema: the history, the checker's runs and the ts-map
	// live in the applier's meta schema. Default: none (required).
	MetaSchema string `toml:"-"`

	// checked is set by Checked: New takes the config as it is.
	checked bool
}

// Checked validates c and returns it marked, so that New does not validate it again (the
// daemon checks its configuration once).
func (c Config) Checked() (Config, error) {
	if c.checked {
		return c, nil
	}
	if err := c.Validate(); err != nil {
		return c, err
	}
	c.checked = true
	return c, nil
}

// Schedule is one [[verify.schedule]] entry.
type Schedule struct {
	// Name names the schedule's runs (their trigger) in the history and metrics;
	// unique, and neither "manual" nor "continuous".
	// Default: none (required)
	Name string `toml:"name"`
	// Cron is when it fires: five fields (minute hour day-of-month month day-of-week),
	// optionally preceded by seconds, or a descriptor (@daily, @hourly, @every 1h30m); in
	// the daemon's local time zone unless prefixed with CRON_TZ=<zone>.
	// Default: none (required)
	Cron string `toml:"cron"`
	// Scope of its runs (see verify.scope).
	// Default: verify.scope
	Scope string `toml:"scope"`
	// Tables of its runs (see verify.tables).
	// Default: verify.tables
	Tables []string `toml:"tables"`
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		Tables:            []string{},
		Exclude:           []string{},
		Scope:             ScopeFull,
		CaughtUpLag:       30 * time.Second,
		MaxViewAge:        10 * time.Minute,
		MaxConcurrentRuns: 1,
		MaxLag:            time.Minute,
		MaxConnections:    2,
		QueryTimeout:      5 * time.Minute,
		TSMapInterval:     time.Minute,
		HistoryRetention:  90 * 24 * time.Hour,
	}
}

// cronParser reads Schedule.Cron: standard cron with optional seconds and descriptors.
var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Validate reports every problem with its key path.
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	if c.Enabled && len(c.Tables) == 0 {
		bad("verify.tables", "at least one table pattern is required with verify.enabled")
	}
	for i, t := range c.Tables {
		if err := checker.CheckTablePattern(t); err != nil {
			bad(fmt.Sprintf("verify.tables[%d]", i), "%v", err)
		}
	}
	for i, t := range c.Exclude {
		if err := checker.CheckTablePattern(t); err != nil {
			bad(fmt.Sprintf("verify.exclude[%d]", i), "%v", err)
		}
	}
	if err := CheckScope(c.Scope); err != nil {
		bad("verify.scope", "%v", err)
	}
	if c.CaughtUpLag < 0 {
		bad("verify.caught-up-lag", "must not be negative, got %v", c.CaughtUpLag)
	}
	if c.MaxViewAge < time.Second {
		bad("verify.max-view-age", "must be at least 1s, got %v", c.MaxViewAge)
	}
	if c.ContinuousInterval < 0 {
		bad("verify.continuous-interval", "must not be negative, got %v", c.ContinuousInterval)
	}
	if c.MaxConcurrentRuns < 1 || c.MaxConcurrentRuns > 64 {
		bad("verify.max-concurrent-runs", "must be between 1 and 64, got %d", c.MaxConcurrentRuns)
	}
	if c.MaxLag < 0 {
		bad("verify.max-lag", "must not be negative, got %v", c.MaxLag)
	}
	if c.MaxConnections < 1 || c.MaxConnections > 64 {
		bad("verify.max-connections", "must be between 1 and 64, got %d", c.MaxConnections)
	}
	if c.MaxRowsPerSecond < 0 {
		bad("verify.max-rows-per-second", "must not be negative, got %d", c.MaxRowsPerSecond)
	}
	if c.MaxThreadsRunning < 0 {
		bad("verify.max-threads-running", "must not be negative, got %d", c.MaxThreadsRunning)
	}
	if c.HistoryRetention != 0 && c.HistoryRetention < time.Hour {
		bad("verify.history-retention", "must be 0 (keep every run) or at least 1h, got %v", c.HistoryRetention)
	}
	if c.QueryTimeout <= 0 {
		bad("verify.query-timeout", "must be positive, got %v", c.QueryTimeout)
	}
	if len(c.Instance) > instance.MaxLen {
		bad("verify.instance", "longer than %d bytes", instance.MaxLen)
	} else if strings.TrimSpace(c.Instance) != c.Instance {
		bad("verify.instance", "%q has leading or trailing space", c.Instance)
	}
	names := map[string]int{}
	for i, s := range c.Schedules {
		key := fmt.Sprintf("verify.schedule[%d]", i)
		switch {
		case s.Name == "":
			bad(key+".name", "required")
		case s.Name == TriggerManual || s.Name == TriggerContinuous:
			bad(key+".name", "%q names another trigger; choose another name", s.Name)
		case len(s.Name) > 128:
			bad(key+".name", "longer than 128 bytes")
		default:
			if j, dup := names[s.Name]; dup {
				bad(key+".name", "%q is also the name of verify.schedule[%d]", s.Name, j)
			}
			names[s.Name] = i
		}
		if s.Cron == "" {
			bad(key+".cron", "required")
		} else if _, err := cronParser.Parse(s.Cron); err != nil {
			bad(key+".cron", "%v", err)
		}
		if s.Scope != "" {
			if err := CheckScope(s.Scope); err != nil {
				bad(key+".scope", "%v", err)
			}
		}
		for j, t := range s.Tables {
			if err := checker.CheckTablePattern(t); err != nil {
				bad(fmt.Sprintf("%s.tables[%d]", key, j), "%v", err)
			}
		}
		if c.Enabled && len(s.Tables) == 0 && len(c.Tables) == 0 {
			bad(key+".tables", "required when verify.tables is empty")
		}
	}
	if c.Enabled {
		if c.Changefeed == "" {
			bad("changefeed.id", "required with verify.enabled")
		}
		if c.UpstreamDSN == "" {
			bad("upstream.dsn", "required with verify.enabled: verification reads TiDB at each snapshot pair's TSO")
		} else if _, err := mysql.ParseDSN(c.UpstreamDSN); err != nil {
			bad("upstream.dsn", "%v", err)
		}
		if c.DownstreamDSN == "" {
			bad("downstream.dsn", "required with verify.enabled")
		} else if _, err := mysql.ParseDSN(c.DownstreamDSN); err != nil {
			bad("downstream.dsn", "%v", err)
		}
		if c.MetaSchema == "" {
			bad("applier.meta-schema", "required with verify.enabled")
		}
	}
	return errors.Join(errs...)
}

// CheckScope reports whether scope is one a run can take: full, cdc or
// since:<TSO|time> (checker.ParseScope).
func CheckScope(scope string) error {
	_, err := checker.ParseScope(scope)
	return err
}
