// Package bypass detects writes that bypass parity: it reads the fallback's binlog (as a
// replica would, with go-mysql-org/go-mysql's replication client) and records every row
// change of a replicated table made by a transaction parity's applier did not write.
//
// A fallback must change only through parity; a job, a person or an application pointed
// at the wrong host breaks that silently, and a later diff would report the damage as
// an ordinary difference. parity's own transactions carry a marker (a row of
// <meta>.write_marker written in the same transaction, internal/bypasslog); every other
// transaction with row events on a watched table is a bypass write. Detections go to
// <meta>.bypass_writes together with the position to resume from (one transaction), to
// the log (table, kind, GTID, position; never the key's values), to Status and to
// Prometheus; the checker classifies the differences of their keys as "bypass".
//
// It is its own package because it is its own reader of the fallback, with its own
// connection, failure modes (the binlog purged, the fallback restarting) and lifetime;
// it shares nothing with the applier beyond the meta schema's contract, and a problem
// here never stops replication from the changefeed... except a configuration the
// detector cannot work with (binlog off, binlog_format not ROW), reported at start.
package bypass

import (
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/internal/bypasslog"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/metaschema"
)

// bypassMigrations are the "bypass" component's steps: append-only, "%s" is the quoted
// meta schema.
var bypassMigrations = []metaschema.Step{
	{Name: "bypass_writes and bypass_position: writes that bypass parity", Stmts: []string{
		`CREATE TABLE IF NOT EXISTS %s.` + bypasslog.WritesTable + ` (
			changefeed VARCHAR(128) NOT NULL,
			binlog_file VARCHAR(255) NOT NULL,
			binlog_pos BIGINT UNSIGNED NOT NULL,
			seq INT NOT NULL,
			gtid VARCHAR(255) NOT NULL,
			server_id INT UNSIGNED NOT NULL,
			event_time DATETIME(6) NOT NULL,
			detected_at DATETIME(6) NOT NULL,
			schema_name VARCHAR(64) NOT NULL,
			table_name VARCHAR(64) NOT NULL,
			kind VARCHAR(16) NOT NULL,
			key_columns TEXT NOT NULL,
			key_values LONGBLOB NOT NULL,
			key_text TEXT NOT NULL,
			PRIMARY KEY (changefeed, binlog_file, binlog_pos, seq),
			KEY by_table (changefeed, schema_name, table_name, event_time),
			KEY by_time (changefeed, event_time)
		) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS %s.` + bypasslog.PositionTable + ` (
			changefeed VARCHAR(128) NOT NULL PRIMARY KEY,
			binlog_file VARCHAR(255) NOT NULL,
			binlog_pos BIGINT UNSIGNED NOT NULL,
			gtid VARCHAR(255) NOT NULL,
			event_time DATETIME(6) NULL,
			updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6)
		) ENGINE=InnoDB`,
	}},
	{Name: "bypass_coverage: where each stretch of continuous watching began", Stmts: []string{
		`CREATE TABLE IF NOT EXISTS %s.` + bypasslog.CoverageTable + ` (
			changefeed VARCHAR(128) NOT NULL,
			since_time DATETIME(6) NOT NULL,
			binlog_file VARCHAR(255) NOT NULL,
			binlog_pos BIGINT UNSIGNED NOT NULL,
			reason VARCHAR(255) NOT NULL,
			PRIMARY KEY (changefeed, since_time)
		) ENGINE=InnoDB`,
	}},
}

func init() {
	metaschema.Register(metaschema.Component{Name: "bypass", Tables: []string{bypasslog.WritesTable, bypasslog.PositionTable, bypasslog.CoverageTable}, Steps: bypassMigrations})
}

// maxTxnChanges bounds the changes one transaction records (the rest are counted and
// logged, not recorded): a bulk job on the fallback must not exhaust parity's memory.
const maxTxnChanges = 100000

// recentKept is how many detections Status lists.
const recentKept = 20

// Detection is one recorded change (Status).
type Detection struct {
	Table    string    `json:"table"` // schema.table in the fallback
	Kind     string    `json:"kind"`
	Key      string    `json:"key"`
	GTID     string    `json:"gtid,omitempty"`
	Position string    `json:"position"` // binlog file:pos where the transaction ends
	ServerID uint32    `json:"server_id"`
	Time     time.Time `json:"time"` // the binlog's commit time
	Detected time.Time `json:"detected_at"`
}

// Status is the detector's state for /status.
type Status struct {
	// State is starting, reading, reconnecting or stopped.
	State string `json:"state"`
	// Position is where the detector has read up to (binlog file:pos; it advances with
	// every transaction read), GTID the last transaction read, EventTime its commit time.
	Position  string    `json:"position,omitempty"`
	GTID      string    `json:"gtid,omitempty"`
	EventTime time.Time `json:"event_time,omitzero"`
	// BinlogEnd is the fallback's binlog end when it was last asked (every
	// bypass.save-interval while reading); CaughtUpAt the last time the detector had
	// read everything the binlog held (a time before which every transaction is read);
	// LagSeconds is now - CaughtUpAt: it grows while the detector falls behind or cannot
	// read at all (parity_bypass_lag_seconds).
	BinlogEnd  string    `json:"binlog_end,omitempty"`
	CaughtUpAt time.Time `json:"caught_up_at,omitzero"`
	LagSeconds float64   `json:"lag_seconds"`
	// WatchedSince starts the current stretch of continuous watching (the newest row of
	// <meta>.bypass_coverage): writes before it may have been missed, and a cutover
	// check does not vouch for a table whose window starts earlier. WatchedReason says
	// why the stretch started there.
	WatchedSince  time.Time `json:"watched_since,omitzero"`
	WatchedReason string    `json:"watched_reason,omitempty"`
	// Detections counts the changes recorded since the process started; Recent lists
	// the latest ones, newest first.
	Detections int64       `json:"detections"`
	Recent     []Detection `json:"recent,omitempty"`
	// LastDetectionTime is the commit time of the newest recorded change (also from
	// before a restart).
	LastDetectionTime time.Time `json:"last_detection_time,omitzero"`
	LastError         string    `json:"last_error,omitempty"`
}

// Detector reads the fallback's binlog; see the package comment.
type Detector struct {
	cfg Config
	log *slog.Logger
	my  *mysql.Config

	mu      sync.Mutex
	st      Status
	byTable map[string]int64 // detections per schema.table since start (metrics)
	up      bool
	caught  chan struct{} // closed and replaced whenever CaughtUpAt moves (Cover waits on it)
	waiters atomic.Int32  // Cover calls waiting: the binlog's end is then asked every coverPoll
	started time.Time     // when Run started: the lag before the first catch-up counts from it
}

// New checks cfg; Run does the work.
func New(cfg Config, log *slog.Logger) (*Detector, error) {
	if err := cfg.Validate("bypass."); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	my, err := mysql.ParseDSN(cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("downstream.dsn: %w", err)
	}
	return &Detector{cfg: cfg, log: log.With("component", "bypass"), my: my, st: Status{State: "starting"}, byTable: map[string]int64{},
		caught: make(chan struct{}), started: time.Now()}, nil
}

// Status returns the detector's state.
func (d *Detector) Status() Status {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.st
	s.Recent = slices.Clone(s.Recent)
	s.LagSeconds = d.lagLocked(time.Now()).Seconds()
	return s
}

// lagLocked is how long ago the detector last had read the whole binlog (since Run
// started when it never had). d.mu is held.
func (d *Detector) lagLocked(now time.Time) time.Duration {
	from := d.st.CaughtUpAt
	if from.IsZero() {
		from = d.started
	}
	return max(0, now.Sub(from))
}

// ErrNotWatching is returned by Cover when the detector has no stretch of watching to
// vouch for (it has not started reading yet).
var ErrNotWatching = errors.New("the bypass detector is not watching the binlog yet")

// Cover waits until the detector has read every transaction the fallback's binlog held
// when Cover was called, with its detections saved, and returns what it vouches for:
// the current stretch of watching (bypasslog.Coverage). It fails when ctx ends first
// (the detector is behind or cannot read: the error says how far it had read).
func (d *Detector) Cover(ctx context.Context) (bypasslog.Coverage, error) {
	d.waiters.Add(1)
	defer d.waiters.Add(-1)
	called := time.Now()
	for {
		d.mu.Lock()
		st, ch := d.st, d.caught
		d.mu.Unlock()
		if st.CaughtUpAt.After(called) {
			if st.WatchedSince.IsZero() {
				return bypasslog.Coverage{}, ErrNotWatching
			}
			return bypasslog.Coverage{Since: st.WatchedSince, Reason: st.WatchedReason, Through: st.CaughtUpAt, ThroughPosition: st.BinlogEnd}, nil
		}
		select {
		case <-ctx.Done():
			msg := fmt.Sprintf("the bypass detector has not read the fallback's binlog up to its end (state %s, read up to %s, binlog end %s, last caught up %s)",
				st.State, orNone(st.Position), orNone(st.BinlogEnd), orNever(st.CaughtUpAt))
			if st.LastError != "" {
				msg += ", last error: " + st.LastError
			}
			return bypasslog.Coverage{}, fmt.Errorf("%s: %w", msg, ctx.Err())
		case <-ch:
		}
	}
}

// ceilMicro rounds t up to the microsecond (what DATETIME(6) keeps): a stretch of
// watching never claims an instant before it began.
func ceilMicro(t time.Time) time.Time {
	if r := t.Truncate(time.Microsecond); !r.Equal(t) {
		return r.Add(time.Microsecond)
	}
	return t
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func orNever(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func (d *Detector) setState(state string, err error) {
	d.mu.Lock()
	d.st.State = state
	d.up = state == "reading"
	if err != nil {
		d.st.LastError = err.Error()
	}
	d.mu.Unlock()
}

// position is a place in the binlog: the end of a transaction.
type position struct {
	File string
	Pos  uint32
	GTID string
	Time time.Time
}

func (p position) String() string { return fmt.Sprintf("%s:%d", p.File, p.Pos) }

// Run reads the binlog until ctx ends (then it returns nil), reconnecting from the last
// transaction it finished after a broken connection. It fails at start for a fallback
// without a ROW binlog, and when the position to resume from was purged (detections
// would be missed silently otherwise: the error says how to restart from the current
// end).
func (d *Detector) Run(ctx context.Context) error {
	db, err := sql.Open("mysql", d.cfg.DSN)
	if err != nil {
		return fmt.Errorf("bypass: open the fallback: %w", err)
	}
	defer db.Close()
	db.SetMaxOpenConns(2)
	defer d.setState("stopped", nil)
	s := &session{d: d, db: db, tables: map[[2]string]*tableInfo{}, metaSchemas: map[string]bool{}, ddlThreads: map[uint32]bool{}}
	flavor, err := s.checkServer(ctx)
	if err != nil {
		return err
	}
	if err := metaschema.Migrate(ctx, db, d.cfg.MetaSchema, d.cfg.QueryTimeout); err != nil {
		return fmt.Errorf("bypass: %w", err)
	}
	pos, found, err := s.loadPosition(ctx)
	if err != nil {
		return err
	}
	cov, covered, err := s.loadCoverage(ctx)
	if err != nil {
		return err
	}
	switch {
	case !found:
		if pos, err = s.currentEnd(ctx); err != nil {
			return err
		}
		reason := "first start"
		if covered {
			reason = "the saved binlog position was missing (deleted after a purge, or reset): the binlog since " + cov.Since.UTC().Format(time.RFC3339) + " was not all read"
		}
		cov = bypasslog.Coverage{Since: ceilMicro(pos.Time), SincePosition: pos.String(), Reason: reason}
		// Saved before the first event is read: a restart resumes here, not at a later end.
		if err := s.save(ctx, pos, nil, &cov); err != nil {
			return err
		}
		d.log.Info("bypass detection starts at the binlog's current end", "changefeed", d.cfg.Changefeed, "position", pos.String(), "reason", reason)
	case !covered:
		// A position saved by a release that did not record coverage: when its watching
		// began is unknown, so it is vouched for from now.
		end, err := s.currentEnd(ctx)
		if err != nil {
			return err
		}
		cov = bypasslog.Coverage{Since: ceilMicro(end.Time), SincePosition: pos.String(), Reason: "no coverage recorded before (an earlier release): watched from now"}
		if err := s.save(ctx, pos, nil, &cov); err != nil {
			return err
		}
		d.log.Info("bypass detection resumes; its coverage is recorded from now", "changefeed", d.cfg.Changefeed, "position", pos.String())
	default:
		d.log.Info("bypass detection resumes", "changefeed", d.cfg.Changefeed, "position", pos.String(), "gtid", pos.GTID,
			"watched_since", cov.Since)
	}
	if err := s.loadLast(ctx); err != nil {
		return err
	}
	d.mu.Lock()
	d.st.Position, d.st.GTID, d.st.EventTime = pos.String(), pos.GTID, pos.Time
	d.st.WatchedSince, d.st.WatchedReason = cov.Since, cov.Reason
	d.mu.Unlock()
	s.saved = pos
	backoff := d.cfg.ReconnectBackoff
	lastPrune := time.Time{}
	for {
		if time.Since(lastPrune) > time.Hour {
			if err := s.prune(ctx); err != nil && ctx.Err() == nil {
				d.log.Warn("bypass: pruning old detections failed", "changefeed", d.cfg.Changefeed, "err", err)
			}
			lastPrune = time.Now()
		}
		start := time.Now()
		err := s.stream(ctx, flavor, pos)
		pos = s.read // what was read, even if not saved yet (pending detections stay)
		if ctx.Err() != nil {
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.QueryTimeout)
			ferr := s.flush(fctx, true)
			cancel()
			return ferr
		}
		var me *gomysql.MyError
		if errors.As(err, &me) && me.Code == gomysql.ER_MASTER_FATAL_ERROR_READING_BINLOG {
			return fmt.Errorf("bypass: the fallback cannot send its binlog from %s (purged?): %v; writes since then cannot be checked — "+
				"to start again from the binlog's current end, delete the changefeed's row of %s", pos, me,
				ident.Table(d.cfg.MetaSchema, bypasslog.PositionTable))
		}
		if time.Since(start) > time.Minute {
			backoff = d.cfg.ReconnectBackoff
		}
		d.setState("reconnecting", err)
		// err.Error(): go-mysql's errors print their stack under %+v, which slog uses.
		d.log.Warn("bypass: reading the binlog failed, reconnecting", "changefeed", d.cfg.Changefeed, "position", pos.String(), "backoff", backoff, "err", err.Error())
		select {
		case <-ctx.Done():
			continue
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// session is one Run's state.
type session struct {
	d  *Detector
	db *sql.DB

	tables      map[[2]string]*tableInfo
	metaSchemas map[string]bool

	read      position // the end of the last transaction read
	seen      position // the end of the last event handled outside a transaction (at or after read)
	saved     position
	pending   []change // detections not saved yet
	dirty     bool     // read moved past saved by a transaction that was not the detector's own
	lastSav   time.Time
	polled    time.Time // when the binlog's end was last asked
	target    position  // that end, until it is reached (hasTarget)
	hasTarget bool

	// ddlThreads are the connections parity marked for its DDL (bypasslog.MarkDDLSQL):
	// the next DDL query event from one of them is parity's.
	ddlThreads map[uint32]bool
}

// change is one detected row change, before it is saved.
type change struct {
	at      position
	seq     int
	server  uint32
	schema  string
	table   string
	kind    string
	columns []string
	values  [][]byte
	text    string
}

func (s *session) qctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.d.cfg.QueryTimeout)
}

// checkServer checks the binlog is on and ROW, and returns go-mysql's flavor.
func (s *session) checkServer(ctx context.Context) (string, error) {
	ctx, cancel := s.qctx(ctx)
	defer cancel()
	var version, format string
	var logBin int
	if err := s.db.QueryRowContext(ctx, "SELECT VERSION(), @@log_bin, @@binlog_format").Scan(&version, &logBin, &format); err != nil {
		return "", fmt.Errorf("bypass: read the fallback's binlog settings: %w", err)
	}
	if logBin != 1 {
		return "", errors.New("bypass: the fallback's binary log is off (log_bin): bypass detection reads it; turn it on or set bypass.enabled = false")
	}
	if !strings.EqualFold(format, "ROW") {
		return "", fmt.Errorf("bypass: the fallback's binlog_format is %s: bypass detection needs ROW", format)
	}
	if strings.Contains(strings.ToLower(version), "mariadb") {
		return gomysql.MariaDBFlavor, nil
	}
	return gomysql.MySQLFlavor, nil
}

// currentEnd is where the binlog ends now.
func (s *session) currentEnd(ctx context.Context) (position, error) {
	ctx, cancel := s.qctx(ctx)
	defer cancel()
	rows, err := s.db.QueryContext(ctx, "SHOW MASTER STATUS")
	if err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1064 { // MySQL 8.4: renamed
			rows, err = s.db.QueryContext(ctx, "SHOW BINARY LOG STATUS")
		}
		if err != nil {
			return position{}, fmt.Errorf("bypass: read the binlog's position (needs BINLOG MONITOR or REPLICATION CLIENT): %w", err)
		}
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return position{}, err
	}
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return position{}, fmt.Errorf("bypass: read the binlog's position: %w", err)
		}
		return position{}, errors.New("bypass: SHOW MASTER STATUS returned nothing: is the fallback's binary log on?")
	}
	vals := make([]sql.RawBytes, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := rows.Scan(ptrs...); err != nil {
		return position{}, fmt.Errorf("bypass: read the binlog's position: %w", err)
	}
	pos, err := strconv.ParseUint(string(vals[1]), 10, 32)
	if err != nil {
		return position{}, fmt.Errorf("bypass: binlog position %q: %w", vals[1], err)
	}
	return position{File: string(vals[0]), Pos: uint32(pos), Time: time.Now().UTC()}, rows.Err()
}

func (s *session) loadPosition(ctx context.Context) (position, bool, error) {
	ctx, cancel := s.qctx(ctx)
	defer cancel()
	var p position
	var et any
	err := s.db.QueryRowContext(ctx, "SELECT binlog_file, binlog_pos, gtid, event_time FROM "+
		ident.Table(s.d.cfg.MetaSchema, bypasslog.PositionTable)+" WHERE changefeed = ?", s.d.cfg.Changefeed).Scan(&p.File, &p.Pos, &p.GTID, &et)
	if errors.Is(err, sql.ErrNoRows) {
		return p, false, nil
	}
	if err != nil {
		return p, false, fmt.Errorf("bypass: read the saved binlog position: %w", err)
	}
	p.Time = parseTime(et)
	return p, true, nil
}

// loadCoverage reads the current stretch of watching.
func (s *session) loadCoverage(ctx context.Context) (bypasslog.Coverage, bool, error) {
	ctx, cancel := s.qctx(ctx)
	defer cancel()
	c, ok, err := bypasslog.ReadCoverage(ctx, s.db, s.d.cfg.MetaSchema, s.d.cfg.Changefeed)
	if err != nil {
		return c, false, fmt.Errorf("bypass: %w", err)
	}
	return c, ok, nil
}

// loadLast reads the newest detection's time (for Status and the metric across restarts).
func (s *session) loadLast(ctx context.Context) error {
	ctx, cancel := s.qctx(ctx)
	defer cancel()
	var et any
	if err := s.db.QueryRowContext(ctx, "SELECT MAX(event_time) FROM "+ident.Table(s.d.cfg.MetaSchema, bypasslog.WritesTable)+" WHERE changefeed = ?",
		s.d.cfg.Changefeed).Scan(&et); err != nil {
		return fmt.Errorf("bypass: read the last detection: %w", err)
	}
	s.d.mu.Lock()
	s.d.st.LastDetectionTime = parseTime(et)
	s.d.mu.Unlock()
	return nil
}

func parseTime(v any) time.Time {
	var s string
	switch v := v.(type) {
	case []byte:
		s = string(v)
	case string:
		s = v
	case time.Time:
		return time.Date(v.Year(), v.Month(), v.Day(), v.Hour(), v.Minute(), v.Second(), v.Nanosecond(), time.UTC)
	default:
		return time.Time{}
	}
	t, _ := time.Parse(bypasslog.TimeFormat, s)
	return t
}

// prune deletes detections older than the retention.
func (s *session) prune(ctx context.Context) error {
	ctx, cancel := s.qctx(ctx)
	defer cancel()
	_, err := s.db.ExecContext(ctx, "DELETE FROM "+ident.Table(s.d.cfg.MetaSchema, bypasslog.WritesTable)+" WHERE changefeed = ? AND event_time < ?",
		s.d.cfg.Changefeed, time.Now().UTC().Add(-s.d.cfg.Retention).Format(bypasslog.TimeFormat))
	return err
}

// save records changes and the position after them in one transaction, and cov as a new
// stretch of watching when it is not nil.
func (s *session) save(ctx context.Context, pos position, changes []change, cov *bypasslog.Coverage) error {
	ctx, cancel := s.qctx(ctx)
	defer cancel()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("bypass: save detections: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	now := time.Now().UTC().Format(bypasslog.TimeFormat)
	const perStmt = 200
	for len(changes) > 0 {
		n := min(len(changes), perStmt)
		var b strings.Builder
		b.WriteString("INSERT IGNORE INTO " + ident.Table(s.d.cfg.MetaSchema, bypasslog.WritesTable) +
			" (changefeed, binlog_file, binlog_pos, seq, gtid, server_id, event_time, detected_at, schema_name, table_name, kind, key_columns, key_values, key_text) VALUES ")
		args := make([]any, 0, 14*n)
		for i, c := range changes[:n] {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
			cols, _ := json.Marshal(c.columns)
			if c.columns == nil {
				cols = []byte("[]")
			}
			vals, err := bypasslog.EncodeValues(c.values)
			if err != nil {
				return err
			}
			args = append(args, s.d.cfg.Changefeed, c.at.File, c.at.Pos, c.seq, c.at.GTID, c.server, c.at.Time.UTC().Format(bypasslog.TimeFormat), now,
				c.schema, c.table, c.kind, string(cols), vals, c.text)
		}
		if _, err := tx.ExecContext(ctx, b.String(), args...); err != nil {
			return fmt.Errorf("bypass: save detections: %w", err)
		}
		changes = changes[n:]
	}
	var et any
	if !pos.Time.IsZero() {
		et = pos.Time.UTC().Format(bypasslog.TimeFormat)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+ident.Table(s.d.cfg.MetaSchema, bypasslog.PositionTable)+
		" (changefeed, binlog_file, binlog_pos, gtid, event_time) VALUES (?, ?, ?, ?, ?)"+
		" ON DUPLICATE KEY UPDATE binlog_file = VALUES(binlog_file), binlog_pos = VALUES(binlog_pos), gtid = VALUES(gtid), event_time = VALUES(event_time)",
		s.d.cfg.Changefeed, pos.File, pos.Pos, pos.GTID, et); err != nil {
		return fmt.Errorf("bypass: save the binlog position: %w", err)
	}
	if cov != nil {
		file, p, _ := strings.Cut(cov.SincePosition, ":")
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+ident.Table(s.d.cfg.MetaSchema, bypasslog.CoverageTable)+
			" (changefeed, since_time, binlog_file, binlog_pos, reason) VALUES (?, ?, ?, ?, ?)",
			s.d.cfg.Changefeed, cov.Since.UTC().Format(bypasslog.TimeFormat), file, p, cov.Reason); err != nil {
			return fmt.Errorf("bypass: record the start of watching: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("bypass: save detections: %w", err)
	}
	return nil
}

// flush saves the pending detections with the position read, when there are some, or
// when the position moved and save-interval passed (or force).
func (s *session) flush(ctx context.Context, force bool) error {
	if len(s.pending) == 0 && (!s.dirty || (!force && time.Since(s.lastSav) < s.d.cfg.SaveInterval)) {
		return nil
	}
	if err := s.save(ctx, s.read, s.pending, nil); err != nil {
		return err
	}
	d := s.d
	d.mu.Lock()
	for _, c := range s.pending {
		det := Detection{Table: c.schema + "." + c.table, Kind: c.kind, Key: c.text, GTID: c.at.GTID, Position: c.at.String(),
			ServerID: c.server, Time: c.at.Time, Detected: time.Now().UTC()}
		d.st.Recent = append([]Detection{det}, d.st.Recent...)
		if len(d.st.Recent) > recentKept {
			d.st.Recent = d.st.Recent[:recentKept]
		}
		d.st.Detections++
		d.byTable[det.Table]++
		if c.at.Time.After(d.st.LastDetectionTime) {
			d.st.LastDetectionTime = c.at.Time
		}
	}
	d.mu.Unlock()
	for _, c := range s.pending {
		if c.seq == 0 || c.at != s.pending[0].at { // one line per transaction: never the key's values
			d.log.Warn("write that bypassed parity", "changefeed", d.cfg.Changefeed, "table", c.schema+"."+c.table, "kind", c.kind,
				"gtid", c.at.GTID, "position", c.at.String(), "server_id", c.server, "time", c.at.Time)
		}
	}
	s.pending = s.pending[:0]
	s.saved, s.dirty, s.lastSav = s.read, false, time.Now()
	return nil
}

// txn is the transaction being read.
type txn struct {
	gtid    string
	marked  bool
	own     bool // every row event so far is the detector's own position or detections
	rows    bool
	changes []change
	dropped int
}

// stream reads from pos until ctx ends or the connection breaks.
func (s *session) stream(ctx context.Context, flavor string, pos position) error {
	d := s.d
	host, portText, err := net.SplitHostPort(d.my.Addr)
	if err != nil {
		return fmt.Errorf("downstream.dsn: address %q: %w", d.my.Addr, err)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return fmt.Errorf("downstream.dsn: port %q: %w", portText, err)
	}
	syncer := replication.NewBinlogSyncer(replication.BinlogSyncerConfig{
		ServerID:                d.cfg.ServerID,
		Flavor:                  flavor,
		Host:                    host,
		Port:                    uint16(port),
		User:                    d.my.User,
		Password:                d.my.Passwd,
		TLSConfig:               d.my.TLS,
		TimestampStringLocation: time.UTC,
		HeartbeatPeriod:         5 * time.Second,
		ReadTimeout:             30 * time.Second,
		DisableRetrySync:        true, // Run reconnects from the last whole transaction
		Logger:                  slog.New(slog.DiscardHandler),
	})
	defer syncer.Close()
	st, err := syncer.StartSync(gomysql.Position{Name: pos.File, Pos: pos.Pos})
	if err != nil {
		return fmt.Errorf("start reading the binlog at %s: %w", pos, err)
	}
	s.read, s.seen = pos, pos
	d.setState("reading", nil)
	file := pos.File
	var cur *txn
	tick := time.NewTicker(d.cfg.SaveInterval)
	defer tick.Stop()
	for {
		ectx, cancel := context.WithTimeout(ctx, d.pollEvery())
		ev, err := st.GetEvent(ectx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, context.DeadlineExceeded) {
				if err := s.flush(ctx, false); err != nil {
					return err
				}
				if err := s.poll(ctx, cur); err != nil {
					return err
				}
				continue
			}
			return err
		}
		h := ev.Header
		switch e := ev.Event.(type) {
		case *replication.RotateEvent:
			file = string(e.NextLogName)
			if h.Timestamp != 0 || h.LogPos != 0 { // a real rotate: the next file starts
				s.read = position{File: file, Pos: uint32(e.Position), GTID: s.read.GTID, Time: s.read.Time}
				s.seen = s.read
			}
			continue
		case *replication.MariadbGTIDEvent:
			cur = &txn{gtid: e.GTID.String(), own: true}
		case *replication.GTIDEvent:
			cur = &txn{gtid: gtidOf(e), own: true}
		case *replication.QueryEvent:
			q := strings.TrimSpace(string(e.Query))
			switch {
			case strings.EqualFold(q, "BEGIN"):
				if cur == nil {
					cur = &txn{own: true}
				}
				continue
			case strings.EqualFold(q, "COMMIT"): // a transaction of non-transactional tables
			default: // DDL (its own transaction): forget what was read of the tables
				clear(s.tables)
				clear(s.metaSchemas)
				if s.ddlThreads[e.SlaveProxyID] { // one mark, one DDL
					delete(s.ddlThreads, e.SlaveProxyID)
				} else {
					if cur == nil {
						cur = &txn{own: true}
					}
					s.ddl(ctx, cur, string(e.Schema), q)
				}
			}
			s.commit(cur, file, h)
			cur = nil
		case *replication.RowsEvent:
			if cur == nil {
				cur = &txn{own: true}
			}
			s.rows(ctx, cur, h, e)
			continue
		case *replication.XIDEvent:
			s.commit(cur, file, h)
			cur = nil
		default:
			if cur == nil && h.LogPos != 0 { // between transactions (format description, GTID list, checkpoint, ...)
				s.seen = position{File: file, Pos: h.LogPos, GTID: s.read.GTID, Time: s.read.Time}
			}
			continue
		}
		if len(s.pending) > 0 {
			if err := s.flush(ctx, false); err != nil {
				return err
			}
		}
		if len(s.pending) == 0 {
			s.seen = s.read
		}
		select {
		case <-tick.C:
			if err := s.flush(ctx, false); err != nil {
				return err
			}
		default:
		}
		if err := s.poll(ctx, cur); err != nil {
			return err
		}
	}
}

// coverPoll is how often the binlog's end is asked while Cover waits.
const coverPoll = 20 * time.Millisecond

// pollEvery is how often the binlog's end is asked: every save-interval, and every
// coverPoll while a Cover waits.
func (d *Detector) pollEvery() time.Duration {
	if d.waiters.Load() > 0 {
		return min(coverPoll, d.cfg.SaveInterval)
	}
	return d.cfg.SaveInterval
}

// poll asks the fallback where its binlog ends (at most every pollEvery, and only once
// the previous end was reached) and publishes how far the detector has read: Status's
// position and the binlog's end; reached does the rest. cur is the transaction being
// read, if any.
func (s *session) poll(ctx context.Context, cur *txn) error {
	d := s.d
	if s.hasTarget || time.Since(s.polled) < d.pollEvery() {
		s.reached(cur)
		return nil
	}
	asked := time.Now()
	end, err := s.currentEnd(ctx)
	if err != nil {
		return err
	}
	s.polled, s.target, s.hasTarget = asked, end, true
	d.mu.Lock()
	d.st.Position, d.st.GTID, d.st.EventTime = s.read.String(), s.read.GTID, s.read.Time
	d.st.BinlogEnd = end.String()
	d.mu.Unlock()
	s.reached(cur)
	return nil
}

// reached publishes, once the detector has read up to the binlog's end as last asked
// with no detection left unsaved, the time it was asked as CaughtUpAt: every
// transaction committed before then is read (Cover's and the lag's reference). Under a
// steady load the end moves on while it is read; each end asked is still reached soon
// after.
func (s *session) reached(cur *txn) {
	if !s.hasTarget || cur != nil || len(s.pending) > 0 || s.seen.before(s.target) {
		return
	}
	s.hasTarget = false
	d := s.d
	d.mu.Lock()
	d.st.Position, d.st.GTID, d.st.EventTime = s.read.String(), s.read.GTID, s.read.Time
	d.st.CaughtUpAt = s.polled
	close(d.caught)
	d.caught = make(chan struct{})
	d.mu.Unlock()
}

// before reports whether p is an earlier place in the binlog than q: files compare by
// their sequence number (the suffix after the last dot), then by position.
func (p position) before(q position) bool {
	if p.File != q.File {
		pn, perr := strconv.ParseUint(p.File[strings.LastIndexByte(p.File, '.')+1:], 10, 64)
		qn, qerr := strconv.ParseUint(q.File[strings.LastIndexByte(q.File, '.')+1:], 10, 64)
		if perr != nil || qerr != nil {
			return p.File < q.File
		}
		return pn < qn
	}
	return p.Pos < q.Pos
}

// ddlStmt finds the table a DDL statement changes: CREATE, ALTER, DROP, TRUNCATE or
// RENAME TABLE, CREATE or DROP INDEX ... ON; the schema is optional, names may be
// quoted with backticks.
var ddlStmt = regexp.MustCompile(`(?is)^\s*(?:/\*.*?\*/\s*)*` +
	`(?:TRUNCATE\s+(?:TABLE\s+)?` +
	`|(?:CREATE|ALTER|DROP|RENAME)\s+(?:OR\s+REPLACE\s+)?(?:TEMPORARY\s+)?(?:(?:ONLINE|OFFLINE|IGNORE)\s+)*TABLE\s+(?:IF\s+(?:NOT\s+)?EXISTS\s+)?` +
	`|(?:CREATE|DROP)\s+(?:(?:ONLINE|OFFLINE)\s+)?(?:(?:UNIQUE|FULLTEXT|SPATIAL)\s+)?INDEX\s+(?:IF\s+(?:NOT\s+)?EXISTS\s+)?\S+\s+ON\s+)` +
	"(?:(`(?:[^`]|``)+`|[0-9A-Za-z_$]+)\\s*\\.\\s*)?(`(?:[^`]|``)+`|[0-9A-Za-z_$]+)")

// ddl records a DDL statement of another connection than parity's as a detection of
// kind ddl on the table it names, when that table is watched. A statement whose table
// cannot be told (another kind of DDL) changes no replicated table's rows or columns
// that way and is not recorded.
func (s *session) ddl(ctx context.Context, cur *txn, schema, q string) {
	m := ddlStmt.FindStringSubmatch(q)
	if m == nil {
		return
	}
	unquote := func(n string) string {
		if strings.HasPrefix(n, "`") {
			return strings.ReplaceAll(n[1:len(n)-1], "``", "`")
		}
		return n
	}
	if m[1] != "" {
		schema = unquote(m[1])
	}
	table := unquote(m[2])
	cur.own = false
	if schema == "" || !s.watchedSchema(ctx, schema) {
		return
	}
	text := q
	if len(text) > 4096 {
		text = text[:4096] + "…"
	}
	cur.rows = true
	cur.changes = append(cur.changes, change{seq: len(cur.changes), schema: schema, table: table, kind: bypasslog.KindDDL, text: text})
}

// watchedSchema reports whether the tables of schema are replicated (watched).
func (s *session) watchedSchema(ctx context.Context, schema string) bool {
	if systemSchemas[strings.ToLower(schema)] || schema == s.d.cfg.MetaSchema {
		return false
	}
	if len(s.d.cfg.Schemas) > 0 && !slices.Contains(s.d.cfg.Schemas, schema) {
		return false
	}
	isMeta, err := s.isMetaSchema(ctx, schema)
	return err != nil || !isMeta
}

func gtidOf(e *replication.GTIDEvent) string {
	return fmt.Sprintf("%s:%d", uuidText(e.SID), e.GNO)
}

func uuidText(b []byte) string {
	if len(b) != 16 {
		return hex.EncodeToString(b)
	}
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// commit ends the transaction cur at the event with header h: its changes become
// pending unless it carries parity's marker.
func (s *session) commit(cur *txn, file string, h *replication.EventHeader) {
	at := position{File: file, Pos: h.LogPos, Time: time.Unix(int64(h.Timestamp), 0).UTC()}
	if cur != nil {
		at.GTID = cur.gtid
	}
	if h.LogPos == 0 { // an artificial event: no place to resume from
		at.Pos = s.read.Pos
	}
	s.read = at
	if cur == nil {
		s.dirty = true
		return
	}
	if !cur.own || !cur.rows {
		s.dirty = true
	}
	if cur.marked || len(cur.changes) == 0 {
		return
	}
	for i := range cur.changes {
		cur.changes[i].at = at
		cur.changes[i].server = h.ServerID
	}
	if cur.dropped > 0 {
		s.d.log.Warn("a write that bypassed parity changed more rows than are recorded", "changefeed", s.d.cfg.Changefeed,
			"gtid", at.GTID, "position", at.String(), "recorded", len(cur.changes), "not_recorded", cur.dropped)
	}
	s.pending = append(s.pending, cur.changes...)
}

// rows handles a row event of transaction cur.
func (s *session) rows(ctx context.Context, cur *txn, h *replication.EventHeader, e *replication.RowsEvent) {
	cur.rows = true
	if cur.marked || e.Table == nil {
		return
	}
	schema, table := string(e.Table.Schema), string(e.Table.Table)
	meta := s.d.cfg.MetaSchema
	if schema == meta {
		switch table {
		case bypasslog.MarkerTable:
			cur.marked = true
			cur.changes, cur.dropped = nil, 0
			s.markDDLThreads(e)
		case bypasslog.PositionTable, bypasslog.WritesTable:
		default:
			cur.own = false
		}
		return
	}
	cur.own = false
	info := s.table(ctx, schema, table)
	if !info.watched {
		return
	}
	var kind string
	switch h.EventType {
	case replication.WRITE_ROWS_EVENTv0, replication.WRITE_ROWS_EVENTv1, replication.WRITE_ROWS_EVENTv2, replication.MARIADB_WRITE_ROWS_COMPRESSED_EVENT_V1:
		kind = bypasslog.KindInsert
	case replication.UPDATE_ROWS_EVENTv0, replication.UPDATE_ROWS_EVENTv1, replication.UPDATE_ROWS_EVENTv2, replication.PARTIAL_UPDATE_ROWS_EVENT,
		replication.MARIADB_UPDATE_ROWS_COMPRESSED_EVENT_V1:
		kind = bypasslog.KindUpdate
	default:
		kind = bypasslog.KindDelete
	}
	add := func(row []any, prev *change) *change {
		if len(cur.changes) >= maxTxnChanges {
			cur.dropped++
			return nil
		}
		c := change{seq: len(cur.changes), schema: schema, table: table, kind: kind}
		c.columns, c.values, c.text = info.key(row, int(e.ColumnCount))
		if prev != nil && prev.text == c.text && slices.Equal(prev.columns, c.columns) {
			return nil // an update that kept its key: one change
		}
		cur.changes = append(cur.changes, c)
		return &cur.changes[len(cur.changes)-1]
	}
	if kind == bypasslog.KindUpdate {
		for i := 0; i+1 < len(e.Rows); i += 2 {
			before := add(e.Rows[i], nil)
			if before != nil {
				c := *before
				add(e.Rows[i+1], &c)
			}
		}
		return
	}
	for _, row := range e.Rows {
		add(row, nil)
	}
}

// markDDLThreads remembers the connection a marker row of parity's DDL names
// (bypasslog.MarkDDLSQL: writer "ddl", writes the connection id).
func (s *session) markDDLThreads(e *replication.RowsEvent) {
	for _, row := range e.Rows {
		if len(row) < 3 || text(row[0]) != s.d.cfg.Changefeed || text(row[1]) != bypasslog.DDLWriter {
			continue
		}
		if mark, err := strconv.ParseUint(fmt.Sprint(row[2]), 10, 64); err == nil {
			s.ddlThreads[bypasslog.DDLThread(mark)] = true
		} else if mark, err := strconv.ParseInt(fmt.Sprint(row[2]), 10, 64); err == nil { // BIGINT UNSIGNED above 2^63, read signed
			s.ddlThreads[bypasslog.DDLThread(uint64(mark))] = true
		}
	}
}

// text is a row event's string column as text.
func text(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}

// tableInfo is what the detector knows of a downstream table.
type tableInfo struct {
	watched bool
	cols    []column // in ordinal order, as row events carry them
	keyIdx  []int    // the key's columns
	why     string   // why the key cannot be read, for key_text
}

type column struct {
	name     string
	unsigned bool
	medium   bool     // MEDIUMINT: decoded sign-extended from 24 bits
	enum     []string // ENUM's or SET's members
	set      bool
}

var systemSchemas = map[string]bool{"mysql": true, "information_schema": true, "performance_schema": true, "sys": true}

// table returns what the detector knows of schema.table, reading it on first sight.
// What cannot be read is watched with an unknown key: a change is never dropped for it.
func (s *session) table(ctx context.Context, schema, table string) *tableInfo {
	k := [2]string{schema, table}
	if t := s.tables[k]; t != nil {
		return t
	}
	t := &tableInfo{}
	s.tables[k] = t
	if systemSchemas[strings.ToLower(schema)] || schema == s.d.cfg.MetaSchema {
		return t
	}
	if len(s.d.cfg.Schemas) > 0 && !slices.Contains(s.d.cfg.Schemas, schema) {
		return t
	}
	isMeta, err := s.isMetaSchema(ctx, schema)
	if err == nil && isMeta {
		return t
	}
	t.watched = true
	if err != nil {
		t.why = "key unknown: " + err.Error()
		delete(s.tables, k) // read again next time
		return t
	}
	if err := s.loadTable(ctx, schema, table, t); err != nil {
		t.why = "key unknown: " + err.Error()
		delete(s.tables, k)
	}
	return t
}

// isMetaSchema reports whether schema is a parity meta schema (it holds parity's
// migration table): another parity's bookkeeping is not a replicated table.
func (s *session) isMetaSchema(ctx context.Context, schema string) (bool, error) {
	if v, ok := s.metaSchemas[schema]; ok {
		return v, nil
	}
	ctx, cancel := s.qctx(ctx)
	defer cancel()
	var n int
	if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
		schema, metaschema.VersionTable).Scan(&n); err != nil {
		return false, fmt.Errorf("read schema %s: %w", schema, err)
	}
	s.metaSchemas[schema] = n > 0
	return n > 0, nil
}

func (s *session) loadTable(ctx context.Context, schema, table string, t *tableInfo) error {
	ctx, cancel := s.qctx(ctx)
	defer cancel()
	rows, err := s.db.QueryContext(ctx, "SELECT COLUMN_NAME, COLUMN_TYPE, DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION", schema, table)
	if err != nil {
		return err
	}
	for rows.Next() {
		var c column
		var ctype, dtype string
		if err := rows.Scan(&c.name, &ctype, &dtype); err != nil {
			rows.Close()
			return err
		}
		c.unsigned = strings.Contains(strings.ToLower(ctype), "unsigned")
		switch strings.ToLower(dtype) {
		case "mediumint":
			c.medium = true
		case "enum":
			c.enum = members(ctype)
		case "set":
			c.enum, c.set = members(ctype), true
		}
		t.cols = append(t.cols, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if len(t.cols) == 0 {
		t.why = "table not found"
		return nil
	}
	rows, err = s.db.QueryContext(ctx, "SELECT INDEX_NAME, COLUMN_NAME, NULLABLE FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND NON_UNIQUE = 0 ORDER BY INDEX_NAME = 'PRIMARY' DESC, INDEX_NAME, SEQ_IN_INDEX", schema, table)
	if err != nil {
		return err
	}
	defer rows.Close()
	type idx struct {
		cols     []string
		nullable bool
	}
	var order []string
	idxs := map[string]*idx{}
	for rows.Next() {
		var name, col, nullable string
		if err := rows.Scan(&name, &col, &nullable); err != nil {
			return err
		}
		x := idxs[name]
		if x == nil {
			x = &idx{}
			idxs[name] = x
			order = append(order, name)
		}
		x.cols = append(x.cols, col)
		x.nullable = x.nullable || nullable == "YES"
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, name := range order {
		x := idxs[name]
		if x.nullable {
			continue
		}
		for _, col := range x.cols {
			for i, c := range t.cols {
				if strings.EqualFold(c.name, col) {
					t.keyIdx = append(t.keyIdx, i)
				}
			}
		}
		return nil
	}
	t.why = "no primary or NOT NULL unique key"
	return nil
}

// members parses ENUM('a','b') / SET('a','b').
func members(ctype string) []string {
	open, end := strings.IndexByte(ctype, '('), strings.LastIndexByte(ctype, ')')
	if open < 0 || end <= open {
		return nil
	}
	var out []string
	body := ctype[open+1 : end]
	for i := 0; i < len(body); {
		if body[i] != '\'' {
			i++
			continue
		}
		var b strings.Builder
		j := i + 1
		for j < len(body) {
			if body[j] == '\'' {
				if j+1 < len(body) && body[j+1] == '\'' {
					b.WriteByte('\'')
					j += 2
					continue
				}
				break
			}
			if body[j] == '\\' && j+1 < len(body) {
				j++
			}
			b.WriteByte(body[j])
			j++
		}
		out = append(out, b.String())
		i = j + 1
	}
	return out
}

// key returns the key of row (a row image of n columns): its columns, their values as
// the server's text protocol prints them, and a readable form.
func (t *tableInfo) key(row []any, n int) ([]string, [][]byte, string) {
	if t.why != "" || len(t.keyIdx) == 0 {
		if t.why == "" {
			t.why = "key unknown"
		}
		return nil, nil, "(" + t.why + ")"
	}
	if n != len(t.cols) || len(row) != len(t.cols) {
		return nil, nil, fmt.Sprintf("(key unknown: the event has %d columns, the table now %d)", len(row), len(t.cols))
	}
	cols := make([]string, len(t.keyIdx))
	vals := make([][]byte, len(t.keyIdx))
	var text strings.Builder
	for i, ci := range t.keyIdx {
		c := t.cols[ci]
		cols[i] = c.name
		vals[i] = c.text(row[ci])
		if i > 0 {
			text.WriteString(", ")
		}
		text.WriteString(c.name + "=" + c.literal(row[ci], vals[i]))
	}
	return cols, vals, text.String()
}

// text is v as the server's text protocol prints it (nil: NULL).
func (c column) text(v any) []byte {
	switch v := v.(type) {
	case nil:
		return nil
	case int8:
		if c.unsigned {
			return strconv.AppendUint(nil, uint64(uint8(v)), 10)
		}
		return strconv.AppendInt(nil, int64(v), 10)
	case int16:
		if c.unsigned {
			return strconv.AppendUint(nil, uint64(uint16(v)), 10)
		}
		return strconv.AppendInt(nil, int64(v), 10)
	case int32:
		if c.unsigned {
			if c.medium {
				return strconv.AppendUint(nil, uint64(uint32(v)&0xFFFFFF), 10)
			}
			return strconv.AppendUint(nil, uint64(uint32(v)), 10)
		}
		return strconv.AppendInt(nil, int64(v), 10)
	case int64:
		switch {
		case c.enum != nil && c.set:
			var names []string
			for i, m := range c.enum {
				if v&(1<<i) != 0 {
					names = append(names, m)
				}
			}
			return []byte(strings.Join(names, ","))
		case c.enum != nil:
			if v >= 1 && int(v) <= len(c.enum) {
				return []byte(c.enum[v-1])
			}
			return []byte{}
		case c.unsigned:
			return strconv.AppendUint(nil, uint64(v), 10)
		}
		return strconv.AppendInt(nil, v, 10)
	case int:
		return strconv.AppendInt(nil, int64(v), 10)
	case float32:
		return strconv.AppendFloat(nil, float64(v), 'g', -1, 32)
	case float64:
		return strconv.AppendFloat(nil, v, 'g', -1, 64)
	case string:
		return []byte(v)
	case []byte:
		return slices.Clone(v)
	case fmt.Stringer:
		return []byte(v.String())
	}
	return fmt.Append(nil, v)
}

// literal is a readable SQL literal of a key value.
func (c column) literal(v any, text []byte) string {
	switch v.(type) {
	case nil:
		return "NULL"
	case int8, int16, int32, int64, int, float32, float64:
		if c.enum == nil {
			return string(text)
		}
	}
	if !utf8.Valid(text) {
		return "0x" + hex.EncodeToString(text)
	}
	return "'" + strings.ReplaceAll(string(text), "'", "''") + "'"
}
