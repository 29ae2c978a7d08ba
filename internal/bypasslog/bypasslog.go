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
// event_time the binlog's commit time (seconds), kind insert, update or delete. The key
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
)

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
// with an event time at or before until, oldest first.
func Read(ctx context.Context, q Querier, metaSchema, changefeed, schema, table string, until time.Time) ([]Write, error) {
	rows, err := q.QueryContext(ctx, "SELECT binlog_file, binlog_pos, seq, gtid, server_id, event_time, kind, key_columns, key_values, key_text FROM "+
		ident.Table(metaSchema, WritesTable)+" WHERE changefeed = ? AND schema_name = ? AND table_name = ? AND event_time <= ? ORDER BY event_time, binlog_file, binlog_pos, seq",
		changefeed, schema, table, until.UTC().Format(TimeFormat))
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
