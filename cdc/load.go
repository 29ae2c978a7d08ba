package cdc

// load.go writes an apply worker's upserts with LOAD DATA LOCAL INFILE ... REPLACE
// instead of multi-row INSERT ... ON DUPLICATE KEY UPDATE when the rows allow it. The
// fallback parses tab-separated values much more cheaply than SQL value lists: on the
// test MariaDB, 400,000 sysbench rows in 256-row statements cost the server 1.8-1.9 s
// of CPU as LOAD DATA against 2.4-2.5 s as INSERT (and 4.1-4.2 against 4.7-5.7 s when
// every row replaced an existing one); docs/serve.md. The fallback's CPU is most of what
// applying a changefeed costs the machine, so this is where the applier gains most.
//
// The two statements must leave the same rows, so a statement is loaded only when:
//   - the applier may (applier.load-data, and the fallback's local_infile is ON);
//   - its mode is an upsert or a REPLACE. REPLACE deletes and inserts where ODKU updates:
//     the same row results, and the apply sessions run with foreign_key_checks=0 so no
//     cascade follows the delete; a table with triggers on the fallback is written with
//     INSERT, as its triggers would see a DELETE;
//   - every column's downstream type reads a text field exactly as it reads the SQL
//     literal the INSERT would carry (loadType): integers, DECIMAL, temporal types other
//     than YEAR, and character strings. Not YEAR ('0' as text is 2000, 0 as a number
//     0000), ENUM and SET (a number is an index, the text '1' a member's name), BIT (the
//     text '5' is the byte 0x35), floats, binary strings and JSON;
//   - every value is NULL, an integer or a string (Go values of the decoded event).
//
// A field's bytes are escaped for FIELDS ESCAPED BY '\' (backslash, tab, newline,
// carriage return and NUL), NULL is \N, and the file is read as utf8mb4 (the decoded
// strings are UTF-8). The statement names its separators in hex, so the session's
// NO_BACKSLASH_ESCAPES cannot change them.
//
// With LOCAL, MySQL turns errors in the data into warnings (as IGNORE would), and a
// non-strict sql_mode makes warnings of them in both statements. After each LOAD the
// worker reads @@warning_count: when it is not 0 the transaction is rolled back and
// written again with INSERT statements, whose errors (or warnings) are the applier's
// as before, and the table is written with INSERT from then on.

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync/atomic"
	"unsafe"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/ident"
)

// loadTypes are the downstream DATA_TYPEs (information_schema.COLUMNS) whose columns
// read a text field as they read the SQL literal of the value.
var loadTypes = map[string]bool{
	"tinyint": true, "smallint": true, "mediumint": true, "int": true, "bigint": true,
	"decimal": true,
	"date":    true, "datetime": true, "timestamp": true, "time": true,
	"char": true, "varchar": true, "tinytext": true, "text": true, "mediumtext": true, "longtext": true,
}

// loadType reports whether a downstream column of DATA_TYPE t can be loaded as text.
func loadType(t string) bool { return loadTypes[strings.ToLower(t)] }

// loadColumns reports whether upserts in mode with the column list cols, of a table
// whose downstream is info, can be written by LOAD DATA when their values allow it
// (loadValues).
func loadColumns(info *tableInfo, mode writeMode, cols []open.Column) bool {
	if info == nil || !info.exists {
		return false
	}
	switch mode {
	case modeUpsert:
		if info.triggers {
			return false
		}
	case modeReplace:
	default:
		return false
	}
	if info.noLoad.Load() {
		return false
	}
	for i := range cols {
		if !info.loadable[strings.ToLower(cols[i].Name)] {
			return false
		}
	}
	return true
}

// loadValues reports whether every value of a row is one LOAD DATA is given: NULL, an
// integer or a string.
func loadValues(cols []open.Column) bool {
	for i := range cols {
		switch cols[i].Value.(type) {
		case nil, int64, uint64, string:
		default:
			return false
		}
	}
	return true
}

// appendLoadData appends rows as the LOAD DATA file of loadStatement.
func appendLoadData(dst []byte, rows [][]open.Column) []byte {
	for _, r := range rows {
		for i := range r {
			if i > 0 {
				dst = append(dst, '\t')
			}
			switch v := r[i].Value.(type) {
			case nil:
				dst = append(dst, '\\', 'N')
			case int64:
				dst = strconv.AppendInt(dst, v, 10)
			case uint64:
				dst = strconv.AppendUint(dst, v, 10)
			case string:
				dst = appendLoadField(dst, v)
			}
		}
		dst = append(dst, '\n')
	}
	return dst
}

// loadEscapes maps a byte that must be escaped in a field to the letter after the
// backslash (0: written as it is).
var loadEscapes = [256]byte{'\\': '\\', '\t': 't', '\n': 'n', '\r': 'r', 0: '0'}

// appendLoadField appends s escaped for FIELDS ESCAPED BY '\'.
func appendLoadField(dst []byte, s string) []byte {
	i := loadEscapeIndex(s)
	if i < 0 {
		return append(dst, s...)
	}
	start := 0
	for ; i < len(s); i++ {
		if e := loadEscapes[s[i]]; e != 0 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', e)
			start = i + 1
		}
	}
	return append(dst, s[start:]...)
}

// loadEscapeIndex returns the index of s's first byte that needs an escape, or -1. It
// reads 8 bytes at a time: a field is mostly text without any (a byte-by-byte loop was
// 12 % of serve's CPU in the big-transaction benchmark).
func loadEscapeIndex(s string) int {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	i := 0
	if len(s) >= 8 {
		b := unsafe.Slice(unsafe.StringData(s), len(s))
		for ; i+8 <= len(b); i += 8 {
			x := binary.LittleEndian.Uint64(b[i:])
			bs := x ^ (ones * '\\')
			// A byte below 0x20 (every escaped byte but the backslash) or a backslash.
			if ((x-ones*0x20)&^x|(bs-ones)&^bs)&highs != 0 {
				break
			}
		}
	}
	for ; i < len(s); i++ {
		if loadEscapes[s[i]] != 0 {
			return i
		}
	}
	return -1
}

// loadNames numbers the readers registered with the driver (process-wide: several
// replicators may run in one process).
var loadNames atomic.Uint64

// loadStatement returns the LOAD DATA statement for rows with the column list cols,
// reading the driver's reader name.
func loadStatement(schema, table, name string, cols []open.Column) string {
	var b strings.Builder
	b.WriteString("LOAD DATA LOCAL INFILE 'Reader::")
	b.WriteString(name)
	b.WriteString("' REPLACE INTO TABLE ")
	b.WriteString(ident.Table(schema, table))
	b.WriteString(" CHARACTER SET utf8mb4 FIELDS TERMINATED BY 0x09 ENCLOSED BY '' ESCAPED BY 0x5c LINES TERMINATED BY 0x0a STARTING BY '' (")
	for i := range cols {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(ident.Quote(cols[i].Name))
	}
	b.WriteByte(')')
	return b.String()
}

// newLoadStmt makes the statement of a transaction that loads rows; data (an apply
// worker's buffer) holds their file. rows are kept to write them with INSERT instead.
func newLoadStmt(schema, table string, mode writeMode, info *tableInfo, rows [][]open.Column, data []byte) txnStmt {
	name := "parity-load-" + strconv.FormatUint(loadNames.Add(1), 10)
	return txnStmt{
		table: ident.Table(schema, table),
		q:     loadStatement(schema, table, name, rows[0]),
		text:  data,
		load:  &loadData{name: name, schema: schema, tbl: table, mode: mode, info: info, rows: rows},
	}
}

// loadData is what a LOAD DATA statement of a transaction needs besides its text and
// its file (txnStmt.text).
type loadData struct {
	name        string // the driver's reader
	schema, tbl string
	mode        writeMode
	info        *tableInfo
	rows        [][]open.Column
}

// errLoadWarnings is returned by execMarked when a LOAD DATA statement left warnings:
// the transaction was rolled back, and is to be written with INSERT.
type errLoadWarnings struct {
	table    string
	warnings int
}

func (e *errLoadWarnings) Error() string {
	return fmt.Sprintf("%s: LOAD DATA left %d warning(s)", e.table, e.warnings)
}

// execLoad runs a LOAD DATA statement in tx and reports its warnings as *errLoadWarnings.
func execLoad(ctx context.Context, tx *sql.Tx, s *txnStmt) error {
	data := s.text
	mysql.RegisterReaderHandler(s.load.name, func() io.Reader { return bytes.NewReader(data) })
	_, err := tx.ExecContext(ctx, s.q)
	mysql.DeregisterReaderHandler(s.load.name)
	if err != nil {
		return fmt.Errorf("%s: %w", s.table, err)
	}
	var n int
	if err := tx.QueryRowContext(ctx, "SELECT @@warning_count").Scan(&n); err != nil {
		return fmt.Errorf("%s: reading the warnings of LOAD DATA: %w", s.table, err)
	}
	if n != 0 {
		return &errLoadWarnings{table: s.table, warnings: n}
	}
	return nil
}

// asInserts returns stmts with every LOAD DATA statement written as INSERT instead
// (marking its table so that it is not loaded again), in texts' buffers.
func asInserts(stmts []txnStmt, texts *stmtTexts) []txnStmt {
	out := make([]txnStmt, len(stmts))
	for i, s := range stmts {
		if s.load == nil {
			out[i] = s
			continue
		}
		s.load.info.noLoad.Store(true)
		out[i] = texts.upsert(s.load.schema, s.load.tbl, s.load.rows, s.load.mode)
	}
	return out
}

// localInfile reports whether the server accepts LOAD DATA LOCAL (@@local_infile).
func localInfile(ctx context.Context, db *sql.DB) (bool, error) {
	var on bool
	if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.local_infile").Scan(&on); err != nil {
		return false, fmt.Errorf("reading local_infile: %w", err)
	}
	return on, nil
}
