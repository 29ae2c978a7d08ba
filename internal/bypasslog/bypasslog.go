// Package bypasslog is the contract of writes that bypass parity: the meta-schema tables
// through which the applier (cdc) marks its own transactions in the fallback's binlog,
// the bypass detector (cdc/bypass) records every other transaction that changed a
// replicated table, and the checker (classification) reads those records. Writer and
// readers are different packages that must not import each other (the checker never
// imports cdc); this leaf package holds what they share: the tables' names and columns,
// the encoding of a detected key, and the reader's side (Read).
//
// # The marker
//
//	write_marker (changefeed, writer, writes)  PRIMARY KEY (changefeed, writer)
//
// Every transaction in which parity writes rows of a replicated table (an apply
// worker's statement, a keyless table's unit, a repair's statement) also upserts its
// writer's row of write_marker first ("apply-3", "repair"), in the same transaction. In
// a ROW binlog that transaction therefore holds a row event of <meta>.write_marker whose
// first column is the changefeed: a transaction is parity's exactly when it does. The
// marker needs no privilege and no server setting beyond binlog_format=ROW, and it is as
// durable as the rows it marks: it survives restarts of parity and of the server, and a
// crash cannot separate a row from its marker.
//
// A DDL is its own transaction and cannot carry a row of write_marker. Before executing
// one, parity upserts the row (changefeed, "ddl", writes = DDLMark(seq, the DDL
// connection's CONNECTION_ID())) on the same connection (MarkDDLSQL; seq changes with
// every DDL, so the row always changes and the server always logs it): the detector then
// takes the next DDL query event whose thread id (its slave_proxy_id) is that one for
// parity's, and records every other DDL on a watched table as a detection of kind
// "ddl".
//
// # The detections
//
//	bypass_writes (changefeed, binlog_file, binlog_pos, seq, gtid, server_id, event_time,
//	  detected_at, schema_name, table_name, kind, key_columns, key_values, key_text)
//	  PRIMARY KEY (changefeed, binlog_file, binlog_pos, seq)
//
// One row per row change of a replicated table in a transaction without the marker:
// binlog_file and binlog_pos are where the transaction ends (its commit event's end,
// the position to resume after it), seq the change's place in the transaction, gtid the
// transaction's GTID (MariaDB domain-server-seq, or MySQL's uuid:n; "" without GTIDs),
// event_time the binlog's commit time (seconds), kind insert, update, delete or ddl (a
// DDL made straight in the fallback: no key; key_text holds the statement). The key
// is the downstream table's primary key (or first NOT NULL unique key): key_columns a
// JSON array of its column names, key_values (EncodeValues) their values as the
// server's text protocol prints them (TIMESTAMP in UTC), key_text a readable form. An
// update that changes the key records both keys. A table without such a key records an
// empty key (its differences are not classified by key anyway).
//
//	bypass_position (changefeed PRIMARY KEY, binlog_file, binlog_pos, gtid, event_time)
//
// Where the detector resumes: it has read every transaction that ends at or before
// (binlog_file, binlog_pos). It is written in the transaction of the detections up to
// it, so a restart neither repeats nor misses one.
//
//	bypass_coverage (changefeed, since_time, binlog_file, binlog_pos, reason)
//	  PRIMARY KEY (changefeed, since_time)
//
// Where each stretch of continuous watching began: the detector writes a row whenever it
// starts reading at the binlog's current end instead of where it left off (its first
// start, a position that was deleted after a purge, or a release that did not record
// coverage), with since_time the time after which every transaction of the fallback is
// read (parity's clock, UTC). Resuming from bypass_position continues the newest
// stretch: the binlog it missed while stopped is read then. A reader (the cutover check)
// takes the newest row as the start of what was watched: every write after since_time is
// either in bypass_writes or not yet read (Coverage says how far it was read).
package bypasslog

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/internal/ident"
)

// Tables of the contract in the meta schema.
const (
	MarkerTable   = "write_marker"
	WritesTable   = "bypass_writes"
	PositionTable = "bypass_position"
)

// Kinds of a detected change.
const (
	KindInsert = "insert"
	KindUpdate = "update"
	KindDelete = "delete"
	KindDDL    = "ddl"
)

// CoverageTable is the contract's table of watched stretches (see the package comment).
const CoverageTable = "bypass_coverage"

// DDLWriter is the marker row's writer of parity's DDL (MarkDDLSQL).
const DDLWriter = "ddl"

// MarkDDLSQL marks the connection that is about to execute parity's DDL: "%s" is the
// quoted meta schema; its arguments the changefeed and DDLMark(seq, CONNECTION_ID()).
const MarkDDLSQL = `INSERT INTO %s.` + MarkerTable + ` (changefeed, writer, writes) VALUES (?, '` + DDLWriter + `', ?)
	ON DUPLICATE KEY UPDATE writes = VALUES(writes)`

// DDLMark is the marker row's writes value for parity's DDL number seq (any number that
// differs from the previous DDL's) on connection id.
func DDLMark(seq uint32, id uint64) uint64 { return uint64(seq)<<32 | id&0xFFFFFFFF }

// DDLThread is the connection id a DDLMark value names.
func DDLThread(mark uint64) uint32 { return uint32(mark) }

// Coverage is what the bypass detector vouches for: every transaction of the fallback
// committed after Since and before Through was read, and its detections are saved.
type Coverage struct {
	// Since starts the current stretch of continuous watching (CoverageTable's newest
	// row); SincePosition is the binlog position it started at; Reason why it started
	// there ("first start", "position reset", ...).
	Since         time.Time
	SincePosition string
	Reason        string
	// Through is a time before which every transaction of the fallback was read;
	// ThroughPosition the binlog end read up to.
	Through         time.Time
	ThroughPosition string
}

// MarkSQL is the marker statement: "%s" is the quoted meta schema; its arguments the
// changefeed and the writer.
const MarkSQL = `INSERT INTO %s.` + MarkerTable + ` (changefeed, writer, writes) VALUES (?, ?, 1)
	ON DUPLICATE KEY UPDATE writes = writes + 1`

// EncodeValues encodes a key's values (nil: SQL NULL) for key_values.
func EncodeValues(vals [][]byte) ([]byte, error) {
	return json.Marshal(vals) // []byte as base64, nil as null
}

// DecodeValues decodes key_values.
func DecodeValues(b []byte) ([][]byte, error) {
	var vals [][]byte
	if len(b) == 0 {
		return nil, nil
	}
	if err := json.Unmarshal(b, &vals); err != nil {
		return nil, fmt.Errorf("decode bypass key values: %w", err)
	}
	return vals, nil
}

// Write is one detected change.
type Write struct {
	File      string
	Pos       uint64
	Seq       int
	GTID      string
	ServerID  uint32
	EventTime time.Time
	Schema    string
	Table     string
	Kind      string
	Columns   []string
	Values    [][]byte // nil entries are NULL
	Text      string
}

// TimeFormat is how event_time and detected_at (DATETIME(6), UTC digits) are written.
const TimeFormat = "2006-01-02 15:04:05.999999"

// parseTime reads a DATETIME column scanned as text or, with parseTime=true, a time.
func parseTime(v any) time.Time {
	switch v := v.(type) {
	case time.Time:
		return time.Date(v.Year(), v.Month(), v.Day(), v.Hour(), v.Minute(), v.Second(), v.Nanosecond(), time.UTC)
	case []byte:
		t, _ := time.Parse(TimeFormat, string(v))
		return t
	case string:
		t, _ := time.Parse(TimeFormat, v)
		return t
	}
	return time.Time{}
}

// Querier runs queries: a *sql.DB, *sql.Conn or *sql.Tx.
type Querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// ErrNoTable is returned by Read when the meta schema has no bypass_writes table (no
// parity that detects bypass writes ever migrated it): nothing is known.
var ErrNoTable = errors.New("no bypass_writes table")

// Read returns the changes to the downstream table schema.table recorded for changefeed
// with an event time at or after since (zero: from the first) and at or before until,
// oldest first.
func Read(ctx context.Context, q Querier, metaSchema, changefeed, schema, table string, since, until time.Time) ([]Write, error) {
	rows, err := q.QueryContext(ctx, "SELECT binlog_file, binlog_pos, seq, gtid, server_id, event_time, kind, key_columns, key_values, key_text FROM "+
		ident.Table(metaSchema, WritesTable)+" WHERE changefeed = ? AND schema_name = ? AND table_name = ? AND event_time >= ? AND event_time <= ? ORDER BY event_time, binlog_file, binlog_pos, seq",
		changefeed, schema, table, since.UTC().Format(TimeFormat), until.UTC().Format(TimeFormat))
	if err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1146 {
			return nil, ErrNoTable
		}
		return nil, fmt.Errorf("read bypass writes of %s: %w", ident.Table(schema, table), err)
	}
	defer rows.Close()
	var out []Write
	for rows.Next() {
		w := Write{Schema: schema, Table: table}
		var cols string
		var vals []byte
		var et any
		if err := rows.Scan(&w.File, &w.Pos, &w.Seq, &w.GTID, &w.ServerID, &et, &w.Kind, &cols, &vals, &w.Text); err != nil {
			return nil, fmt.Errorf("read bypass writes of %s: %w", ident.Table(schema, table), err)
		}
		w.EventTime = parseTime(et)
		if cols != "" {
			if err := json.Unmarshal([]byte(cols), &w.Columns); err != nil {
				return nil, fmt.Errorf("decode bypass key columns of %s: %w", ident.Table(schema, table), err)
			}
		}
		if w.Values, err = DecodeValues(vals); err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read bypass writes of %s: %w", ident.Table(schema, table), err)
	}
	return out, nil
}

// ReadCoverage returns the newest stretch of watching recorded for changefeed
// (CoverageTable); ok is false when none is (or the table does not exist).
func ReadCoverage(ctx context.Context, q Querier, metaSchema, changefeed string) (c Coverage, ok bool, err error) {
	rows, err := q.QueryContext(ctx, "SELECT since_time, binlog_file, binlog_pos, reason FROM "+ident.Table(metaSchema, CoverageTable)+
		" WHERE changefeed = ? ORDER BY since_time DESC LIMIT 1", changefeed)
	if err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1146 {
			return c, false, nil
		}
		return c, false, fmt.Errorf("read the bypass detector's coverage: %w", err)
	}
	defer rows.Close()
	if rows.Next() {
		var since any
		var file string
		var pos uint64
		if err := rows.Scan(&since, &file, &pos, &c.Reason); err != nil {
			return c, false, fmt.Errorf("read the bypass detector's coverage: %w", err)
		}
		c.Since, c.SincePosition, ok = parseTime(since), fmt.Sprintf("%s:%d", file, pos), true
	}
	return c, ok, rows.Err()
}
