package cdc

// streamschema_base.go reads table definitions from a database for streamschema.go: the
// definition of a table the stream has not defined, for its rows (schemaFallback), and
// the definition a DDL of such a table starts from (bases).
//
// Why bases: a table created before the changefeed, or before the part of the stream
// read since the last checkpoint (after every restart), has no definition from the
// stream's DDLs. Its rows take the table's definition from the upstream at their commit
// ts, or, without upstream.dsn, from the fallback's current one — which lags a DDL read
// but not yet run downstream (the applier runs it only once every partition has passed
// its commit ts, and the readers complete the rows after it long before): a row after an
// ADD COLUMN had a column "the table's definition lacks" and stopped the replicator,
// after every restart again. So when a DDL of such a table is first read, the table's
// definition just before it is read (the upstream at commit ts - 1, or the fallback,
// which has not run the DDL yet: it runs only after this reader hands the DDL on, and
// an earlier DDL of the table since the checkpoint would have defined it) and the DDL is
// applied to it, as to a table the stream created. A DDL at or below the checkpoint
// that ran downstream (ddl_applied) is left as it was: the fallback's definition already
// has it.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/pingcap/tidb/pkg/parser/ast"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/cdc/upstream"
	"github.com/tidb-parity/parity/internal/tso"
)

// bases reads the definitions the DDL ev (parsed: stmts) starts from, for the tables
// it changes that the stream has not defined; nil when there are none or it ran
// downstream already. A table that does not exist there is left out (its rows read it
// as before).
func (s *streamSchemas) bases(ctx context.Context, k ddlKey, ev *open.Event, stmts []ast.StmtNode) (map[tableKey]*tableDef, error) {
	if s.defs == nil || ev.CommitTs < s.below || (ev.CommitTs == s.below && s.done[k]) || ev.CommitTs == 0 {
		return nil, nil
	}
	var out map[tableKey]*tableDef
	for _, tk := range changedTables(stmts, ev.Schema) {
		s.mu.Lock()
		v := s.current(tk)
		s.mu.Unlock()
		if (v != nil && (v.def != nil || !v.unknown)) || out[tk] != nil {
			continue // defined (or dropped) by the stream, or read for an earlier statement
		}
		d, err := s.defs(ctx, tk.Schema, tk.Table, ev.CommitTs-1)
		if errors.Is(err, upstream.ErrNoTable) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading the definition of %s.%s (not created by the changefeed's DDLs read so far) before the DDL: %w", tk.Schema, tk.Table, err)
		}
		if out == nil {
			out = map[tableKey]*tableDef{}
		}
		out[tk] = d
	}
	return out, nil
}

// changedTables lists the tables whose definition the statements start from (stmt's
// alter, RENAME's source, CREATE TABLE … LIKE's model).
func changedTables(stmts []ast.StmtNode, schema string) []tableKey {
	name := func(tn *ast.TableName) tableKey {
		if tn.Schema.O != "" {
			return tableKey{tn.Schema.O, tn.Name.O}
		}
		return tableKey{schema, tn.Name.O}
	}
	var out []tableKey
	for _, st := range stmts {
		switch st := st.(type) {
		case *ast.CreateTableStmt:
			if st.ReferTable != nil {
				out = append(out, name(st.ReferTable))
			}
		case *ast.AlterTableStmt:
			out = append(out, name(st.Table))
		case *ast.RenameTableStmt:
			for _, tt := range st.TableToTables {
				out = append(out, name(tt.OldTable))
			}
		case *ast.CreateIndexStmt:
			out = append(out, name(st.Table))
		case *ast.DropIndexStmt:
			out = append(out, name(st.Table))
		}
	}
	return out
}

// schemaReadError is a failure to read a table's definition from a database: not the
// record's fault, so it stops the reader instead of being held against the record.
type schemaReadError struct{ err error }

func (e *schemaReadError) Error() string { return e.err.Error() }
func (e *schemaReadError) Unwrap() error { return e.err }

// schemaDefs reads a table the stream has not defined: from the upstream at ts when
// upstream.dsn is set, else the fallback's current definition (its schema mapped by
// changefeed.schema-map). A table that does not exist is upstream.ErrNoTable; other
// failures are *schemaReadError.
func (r *Replicator) schemaDefs(cfg Config, down *sql.DB) func(ctx context.Context, schema, table string, ts uint64) (*tableDef, error) {
	return func(ctx context.Context, schema, table string, ts uint64) (*tableDef, error) {
		qctx, cancel := context.WithTimeout(ctx, cfg.Applier.QueryTimeout)
		defer cancel()
		wrap := func(where string, err error) error {
			if errors.Is(err, upstream.ErrNoTable) {
				return fmt.Errorf("%s: %w", where, err)
			}
			return &schemaReadError{fmt.Errorf("%s: %w", where, err)}
		}
		if r.rows != nil {
			conn, err := r.rows.db.Conn(qctx)
			if err != nil {
				return nil, &schemaReadError{fmt.Errorf("upstream: %w", err)}
			}
			defer conn.Close()
			release, err := tso.At(qctx, conn, ts)
			if err != nil {
				return nil, &schemaReadError{fmt.Errorf("upstream at ts %d: %w", ts, err)}
			}
			defer release()
			cols, idxs, err := upstream.LoadDefs(qctx, conn, schema, table)
			if err != nil {
				return nil, wrap(fmt.Sprintf("upstream at ts %d", ts), tso.Hint(err))
			}
			return &tableDef{cols: cols, idxs: idxs}, nil
		}
		cols, idxs, err := upstream.LoadDefs(qctx, down, cfg.targetSchema(schema), table)
		if err != nil {
			return nil, wrap("fallback (no upstream.dsn)", err)
		}
		return &tableDef{cols: cols, idxs: idxs}, nil
	}
}

// schemaFallback reads the definition of a table the stream has not defined for its
// rows at ts (schemaDefs).
func (r *Replicator) schemaFallback(cfg Config, down *sql.DB) func(ctx context.Context, schema, table string, ts uint64) (*upstream.Table, error) {
	defs := r.schemaDefs(cfg, down)
	return func(ctx context.Context, schema, table string, ts uint64) (*upstream.Table, error) {
		d, err := defs(ctx, schema, table, ts)
		if errors.Is(err, upstream.ErrNoTable) {
			return nil, &schemaReadError{err}
		}
		if err != nil {
			return nil, err
		}
		t, err := upstream.NewTable(schema, table, d.cols, d.idxs)
		if err != nil {
			return nil, &schemaReadError{err}
		}
		return t, nil
	}
}
