package cdc

// simpleschema.go keeps the simple protocol's schema cache in the meta schema. simple's
// row records carry only a schema version: the column types come from the DDL and
// BOOTSTRAP records before them (cdc/simple), and a replicator that restarts from
// offsets past a table's BOOTSTRAP would otherwise stop at the table's next row with
// simple.ErrNoSchema.
//
// The cache is saved in the transaction of each checkpoint, and only what records added
// since the last checkpoint (simple.Decoder.SchemasSince). That is correct because the
// cache is never older than the offsets it is saved with: a partition reader decodes a
// record (and so learns its schemas) before the coordinator ingests it, and the offsets
// a checkpoint saves are at most the next offset each partition's reader handed over;
// so every DDL or BOOTSTRAP record below the saved offsets was learned before the
// checkpoint's transaction, and is in it or in an earlier one. Schemas of records
// beyond the offsets may be saved too: entries are keyed by table and version and never
// wrong, so reading those records again relearns what is already there. Writing the
// cache separately whenever it changes would also be correct but takes a write (and an
// ordering argument) of its own; the checkpoint's transaction is already there and
// commits offsets and schemas together or neither.

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/tidb-parity/parity/cdc/simple"
	"github.com/tidb-parity/parity/internal/metaschema"
)

// simpleSchemaMigration creates the table of the simple protocol's schema cache.
var simpleSchemaMigration = metaschema.Step{Name: "simple_schema: the simple protocol's table schemas", Stmts: []string{
	// One row per table schema version a DDL or BOOTSTRAP record gave: TiCDC's
	// tableSchema JSON.
	`CREATE TABLE IF NOT EXISTS %s.simple_schema (
		changefeed VARCHAR(128) NOT NULL,
		schema_name VARCHAR(64) NOT NULL,
		table_name VARCHAR(64) NOT NULL,
		schema_version BIGINT UNSIGNED NOT NULL,
		table_schema LONGBLOB NOT NULL,
		PRIMARY KEY (changefeed, schema_name, table_name, schema_version)
	) ENGINE=InnoDB`,
}}

// simpleSchemaTable is the table simpleSchemaMigration creates.
const simpleSchemaTable = "simple_schema"

// writeSimpleSchemas records table schemas through x (the checkpoint's transaction).
// A schema saved before is replaced by its key, so saving one twice is harmless.
func (m *meta) writeSimpleSchemas(ctx context.Context, x interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, entries []simple.SchemaEntry) error {
	for len(entries) > 0 {
		var b strings.Builder
		b.WriteString(m.q("REPLACE INTO %s." + simpleSchemaTable + " (changefeed, schema_name, table_name, schema_version, table_schema) VALUES "))
		var args []any
		size, n := 0, 0
		for n < len(entries) && (n == 0 || size+len(entries[n].TableSchema) < maxStatementBytes) {
			e := entries[n]
			if n > 0 {
				b.WriteByte(',')
			}
			b.WriteString("(?,?,?,?,?)")
			args = append(args, m.changefeed, e.Schema, e.Table, e.Version, e.TableSchema)
			size += len(e.TableSchema) + 64
			n++
		}
		if _, err := x.ExecContext(ctx, b.String(), args...); err != nil {
			return fmt.Errorf("saving simple-protocol schemas: %w", err)
		}
		entries = entries[n:]
	}
	return nil
}

// simpleSchemas reads the changefeed's saved table schemas as a JSON array of TiCDC's
// tableSchema (simple.Decoder.ImportSchemas' input), and how many there are.
func (m *meta) simpleSchemas(ctx context.Context) ([]byte, int, error) {
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	buf := []byte{'['}
	n := 0
	err := m.scan(ctx, "simple-protocol schemas", m.q("SELECT table_schema FROM %s."+simpleSchemaTable+" WHERE changefeed=? ORDER BY schema_name, table_name, schema_version"),
		func(rows *sql.Rows) error {
			var js []byte
			if err := rows.Scan(&js); err != nil {
				return err
			}
			if n > 0 {
				buf = append(buf, ',')
			}
			buf = append(buf, js...)
			n++
			return nil
		}, m.changefeed)
	if err != nil {
		return nil, 0, err
	}
	return append(buf, ']'), n, nil
}

// restoreSimpleSchemas fills dec's schema cache with what the changefeed's checkpoints
// saved, before any record is read.
func (m *meta) restoreSimpleSchemas(ctx context.Context, dec *simple.Decoder) (int, error) {
	data, n, err := m.simpleSchemas(ctx)
	if err != nil {
		return 0, err
	}
	if err := dec.ImportSchemas(data); err != nil {
		return 0, fmt.Errorf("restoring the simple-protocol schemas of %s.%s: %w", m.raw, simpleSchemaTable, err)
	}
	return n, nil
}
