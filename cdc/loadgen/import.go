package loadgen

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/tso"
)

// importBatch is the rows per multi-row INSERT of the fill and the import.
const importBatch = 500

// importRows returns how many rows a table gets before the changefeed: ImportRows for
// sysbench tables, a tenth (at least 1) for the wide all-types table and the keyless one.
func (g *Generator) importRows(t *genTable) int {
	if t.spec.kind == kindSysbench {
		return g.cfg.ImportRows
	}
	return max(1, g.cfg.ImportRows/10)
}

// importData fills every table of every schema on TiDB, then copies TiDB as of one TSO
// (the import TSO) into the downstream, the way dumpling + an import would: same DDL,
// every row read at the snapshot. It returns the import TSO.
func (g *Generator) importData(ctx context.Context) (uint64, error) {
	cfg := &g.cfg
	var fill errgroup.Group
	fill.SetLimit(cfg.Workers)
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	for i, t := range g.tables {
		r := rand.New(rand.NewPCG(seed^0x1a2b3c, uint64(i)))
		fill.Go(func() error { return g.fill(ctx, r, t) })
	}
	if err := fill.Wait(); err != nil {
		return 0, err
	}
	importTs, err := g.tso(ctx)
	if err != nil {
		return 0, err
	}

	rootDSN, err := sessionDSN(cfg.Downstream, "", cfg.TimeZone, false)
	if err != nil {
		return 0, fmt.Errorf("downstream dsn: %w", err)
	}
	root, err := openDB(rootDSN, 2)
	if err != nil {
		return 0, fmt.Errorf("open downstream: %w", err)
	}
	defer root.Close()
	schemas := cfg.Schemas()
	for _, schema := range schemas {
		if _, err := root.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS "+ident.Quote(schema)); err != nil {
			return 0, fmt.Errorf("downstream: create database %s: %w", schema, err)
		}
	}
	// Every statement names its schema; the session's default is the first.
	dsn, _ := sessionDSN(cfg.Downstream, schemas[0], cfg.TimeZone, false)
	down, err := openDB(dsn, cfg.Workers+1)
	if err != nil {
		return 0, fmt.Errorf("open downstream: %w", err)
	}
	defer down.Close()
	for _, t := range g.tables {
		schema := t.meta.Schema
		exists, err := tableExists(ctx, down, schema, t.spec.name)
		if err != nil {
			return 0, fmt.Errorf("downstream: %w", err)
		}
		if exists {
			return 0, fmt.Errorf("downstream table %s.%s already exists: the import needs an empty downstream (drop it, or run without import-rows)",
				schema, t.spec.name)
		}
		if err := execTimeout(ctx, down, t.spec.ddlIn(schema)); err != nil {
			return 0, fmt.Errorf("downstream: create table %s.%s: %w", schema, t.spec.name, err)
		}
	}
	var cp errgroup.Group
	cp.SetLimit(cfg.Workers)
	for _, t := range g.tables {
		cp.Go(func() error { return g.copyTable(ctx, down, t, importTs) })
	}
	if err := cp.Wait(); err != nil {
		return 0, err
	}
	if cfg.ImportTSFile != "" {
		if err := writeFileAtomic(cfg.ImportTSFile, []byte(strconv.FormatUint(importTs, 10)+"\n")); err != nil {
			return 0, fmt.Errorf("write import ts file: %w", err)
		}
	}
	return importTs, nil
}

// fill inserts the table's import rows on TiDB.
func (g *Generator) fill(ctx context.Context, r *rand.Rand, t *genTable) error {
	n := g.importRows(t)
	var next int64 = 1
	if t.idCol >= 0 {
		var max int64
		q := "SELECT IFNULL(MAX(" + ident.Quote(t.meta.Columns[t.idCol].Name) + "), 0) FROM " + t.meta.QualifiedName()
		if err := g.up.QueryRowContext(ctx, q).Scan(&max); err != nil {
			return fmt.Errorf("read max id of %s: %w", t.meta.QualifiedName(), err)
		}
		next = max + 1
		t.nextID.Store(next + int64(n))
	}
	for done := 0; done < n; {
		k := min(importBatch, n-done)
		rows := make([][]any, k)
		for i := range rows {
			rows[i] = g.newRowValues(r, t, next)
			next++
		}
		ictx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err := g.insertRows(ictx, g.up, t, rows)
		cancel()
		if err != nil {
			return err
		}
		done += k
	}
	return nil
}

// isBinaryType reports data types whose values are bytes rather than text.
func isBinaryType(dataType string) bool {
	switch dataType {
	case "binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "bit":
		return true
	}
	return false
}

// copyTable reads the table on TiDB at ts and writes every row to the downstream.
func (g *Generator) copyTable(ctx context.Context, down *sql.DB, t *genTable, ts uint64) error {
	conn, err := g.up.Conn(ctx)
	if err != nil {
		return fmt.Errorf("import %s: %w", t.meta.QualifiedName(), err)
	}
	defer conn.Close()
	release, err := tso.At(ctx, conn, ts)
	if err != nil {
		return fmt.Errorf("import %s: %w", t.meta.QualifiedName(), err)
	}
	defer release()
	cols := make([]string, len(t.meta.Columns))
	for i, c := range t.meta.Columns {
		cols[i] = ident.Quote(c.Name)
	}
	q := "SELECT " + strings.Join(cols, ", ") + " FROM " + t.meta.QualifiedName()
	if t.idCol >= 0 {
		q += " ORDER BY " + cols[t.idCol]
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	rows, err := conn.QueryContext(rctx, q)
	if err != nil {
		return fmt.Errorf("import %s: read at %d: %w", t.meta.QualifiedName(), ts, err)
	}
	defer rows.Close()
	raw := make([]sql.RawBytes, len(cols))
	dest := make([]any, len(cols))
	for i := range raw {
		dest[i] = &raw[i]
	}
	var batch [][]any
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		ictx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		err := g.insertRows(ictx, down, t, batch)
		batch = batch[:0]
		if err != nil {
			return fmt.Errorf("import into downstream: %w", err)
		}
		return nil
	}
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return fmt.Errorf("import %s: %w", t.meta.QualifiedName(), err)
		}
		row := make([]any, len(cols))
		for i, c := range t.meta.Columns {
			switch {
			case raw[i] == nil:
				row[i] = nil
			case isBinaryType(c.DataType):
				row[i] = append([]byte{}, raw[i]...)
			default:
				row[i] = string(raw[i])
			}
		}
		batch = append(batch, row)
		if len(batch) == importBatch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("import %s: %w", t.meta.QualifiedName(), err)
	}
	return flush()
}
