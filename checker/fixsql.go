package checker

// fixsql.go streams a table's fix SQL from the stored differences: the one form of it,
// which parity diff writes to its fix files (report.go) and RunFixSQL hands to callers
// outside the checker (the daemon's API). The statements themselves are built when a
// difference is stored (fix.go); this file only orders and frames them.

import (
	"context"
	"database/sql"

	"github.com/tidb-parity/parity/internal/ident"
)

// fixSQL streams table t's fix SQL to emit: the header, then the stored fix statements
// (deletes first), each ending in ";\n". Without stored differences only the header
// is emitted when always is set (a fix file is never empty), else nothing.
func (s *store) fixSQL(ctx context.Context, t storedTable, always bool, emit func(sql string) error) error {
	header := false
	head := func() error {
		header = true
		return emit(fixHeader(s.runID, ident.Table(t.downSchema, t.downName), ident.Table(t.upSchema, t.upTable)))
	}
	if always {
		if err := head(); err != nil {
			return err
		}
	}
	return s.differences(ctx, t.idx, -1, true, func(_ Difference, fix string) error {
		if !header {
			if err := head(); err != nil {
				return err
			}
		}
		return emit(fix + "\n")
	})
}

// RunFixSQL streams the fix SQL of the finished checker run runID in the meta schema
// metaSchema of db — exactly what parity diff writes to its fix files — table by table
// in the run's order: emit gets the downstream table ("schema.table", unquoted) and
// whole statements (first the table's header of SET statements and comments, then one
// call per difference's statements, deletes first), each ending in ";\n". Tables
// without differences emit nothing. tables filters as RunDifferences does; an unknown
// run is ErrRunNotFound, one still running ErrRunRunning.
func RunFixSQL(ctx context.Context, db *sql.DB, metaSchema, runID string, tables []string, emit func(table, sql string) error) error {
	s, keep, err := finishedRun(ctx, db, metaSchema, runID, tables)
	if err != nil {
		return err
	}
	for _, t := range keep {
		name := t.downSchema + "." + t.downName
		if err := s.fixSQL(ctx, t, false, func(sql string) error { return emit(name, sql) }); err != nil {
			return err
		}
	}
	return nil
}
