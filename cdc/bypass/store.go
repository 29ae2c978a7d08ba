package bypass

// store.go owns the detector's side of the meta schema's contract (internal/bypasslog):
// its migrations, the saved position, the detections and their pruning, each saved in one
// transaction with the position after them.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

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
