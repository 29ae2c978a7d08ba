package checker

// planner.go owns what a run compares: the table list (a new run lists the upstream's
// tables and stores them; a resumed run reads them back), both structures of each table,
// their differences, and the comparison plan. Its output, one target per table, does not
// change once planned. It must not cut chunks, compare rows or count results.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
)

// target is one table of a run as planned: what is compared, and how.
type target struct {
	idx      int
	name     string // upstream schema.table, for logs and errors
	stored   storedTable
	plan     *tablePlan // nil when fatal
	problems []StructureProblem
	fatal    bool // the data is not compared (a fatal structure problem)
	estRows  int64
	// maxChunkRows caps the table's chunks so that it is cut into at least MinChunks
	// (TiDBMinChunks from TiDB) chunks, and 4 per worker (0: its size is unknown).
	maxChunkRows int
	// handle is how the changefeed's dirty-key ledger keys the table's rows (dirty.go).
	handle handleKey
}

// planner plans a run's tables on a pair.
type planner struct {
	cfg  *Config
	pair *sourcePair
	st   *store
	log  *slog.Logger
}

// plan resolves the table list (new run) or reloads it (resume), loads and compares the
// structures and plans every table.
func (pl *planner) plan(ctx context.Context) ([]*target, error) {
	var stored []storedTable
	if pl.cfg.Resume != "" {
		var err error
		if stored, err = pl.st.tables(ctx); err != nil {
			return nil, err
		}
	} else {
		names, err := pl.listTables(ctx)
		if err != nil {
			return nil, err
		}
		for i, n := range names {
			ds, dt := pl.cfg.route(n[0], n[1])
			t := storedTable{idx: i, upSchema: n[0], upTable: n[1], downSchema: ds, downName: dt, checkpoint: -1}
			if err := pl.st.addTable(ctx, t); err != nil {
				return nil, err
			}
			stored = append(stored, t)
		}
	}
	var out []*target
	for _, s := range stored {
		t, err := pl.planTable(ctx, s)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

var systemSchemas = map[string]bool{"mysql": true, "information_schema": true, "performance_schema": true,
	"sys": true, "metrics_schema": true}

func (pl *planner) listTables(ctx context.Context) ([][2]string, error) {
	var out [][2]string
	err := pl.pair.withSide(ctx, upSide, func(ctx context.Context, q Querier) error {
		rows, err := q.QueryContext(ctx, "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE = 'BASE TABLE' ORDER BY TABLE_SCHEMA, TABLE_NAME")
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var s, t string
			if err := rows.Scan(&s, &t); err != nil {
				return err
			}
			if systemSchemas[strings.ToLower(s)] || strings.EqualFold(s, pl.cfg.MetaSchema) {
				continue
			}
			if pl.cfg.selected(s, t) {
				out = append(out, [2]string{s, t})
			}
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("list upstream tables: %w", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no upstream table matches %s", strings.Join(pl.cfg.Tables, ", "))
	}
	return out, nil
}

// planTable loads both structures, compares them and builds the plan. Structure
// differences are recorded in the target, not returned as errors.
func (pl *planner) planTable(ctx context.Context, st storedTable) (*target, error) {
	t := &target{idx: st.idx, name: st.upSchema + "." + st.upTable, stored: st}
	cfg := pl.cfg
	var up, down *tableSchema
	err := pl.pair.withSide(ctx, upSide, func(ctx context.Context, q Querier) error {
		var err error
		up, err = loadTable(ctx, q, st.upSchema, st.upTable)
		if err == nil && up != nil {
			var n sql.NullInt64
			rows, qerr := q.QueryContext(ctx, "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?", st.upSchema, st.upTable)
			if qerr == nil {
				if rows.Next() {
					_ = rows.Scan(&n)
				}
				rows.Close()
			}
			t.estRows = n.Int64
			// Cut at least MinChunks chunks (TiDBMinChunks from TiDB), and 4 per worker,
			// from a table (when its size is known): the workers share the table's tail
			// instead of waiting for one big chunk, and a difference costs a drill-down of
			// one small chunk.
			if n.Int64 > 0 {
				chunks := cfg.MinChunks
				if pl.pair.flavor[upSide] == FlavorTiDB {
					chunks = cfg.TiDBMinChunks
				}
				t.maxChunkRows = max(cfg.MinChunkRows, min(cfg.MaxChunkRows, int(n.Int64/int64(max(chunks, 4*cfg.Concurrency)))))
			}
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("table %s: upstream structure: %w", t.name, err)
	}
	err = pl.pair.withSide(ctx, downSide, func(ctx context.Context, q Querier) error {
		var err error
		down, err = loadTable(ctx, q, st.downSchema, st.downName)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("table %s: downstream structure: %w", t.name, err)
	}
	switch {
	case up == nil:
		t.problems = append(t.problems, StructureProblem{Problem: "table missing upstream", Fatal: true})
		t.fatal = true
		return t, nil
	case down == nil:
		t.problems = append(t.problems, StructureProblem{Problem: fmt.Sprintf("table %s.%s missing downstream", st.downSchema, st.downName), Fatal: true})
		t.fatal = true
		return t, nil
	}
	ignored := cfg.ignoredFunc(st.upSchema, st.upTable)
	t.problems = compareStructure(up, down, ignored)
	plan, err := newPlan(up, down, ignored)
	if err != nil {
		t.problems = append(t.problems, StructureProblem{Problem: err.Error(), Fatal: true})
		t.fatal = true
		return t, nil
	}
	plan.Flavor = pl.pair.flavor
	for s, binary := range pl.pair.binaryStrings {
		if binary {
			plan.compareBytes(pairSide(s))
		}
	}
	plan.Referenced = down.Referenced
	plan.Pushdown = pl.pair.pushdown
	for _, k := range plan.Key {
		c := plan.Columns[k]
		if c.Kind == kindString && c.Collation[0] != c.Collation[1] {
			pl.log.Warn("key column collations differ: the downstream compares chunk ranges with the upstream collation and may not use its index",
				"table", t.name, "column", c.Name, "upstream", c.Collation[0], "downstream", c.Collation[1])
		}
	}
	plan.Hash = cfg.Hash
	plan.Where = cfg.where(st.upSchema, st.upTable)
	if cols := plan.fitEncoding(pl.pair.packet); len(cols) > 0 {
		pl.log.Info("long columns enter the row hash as their SHA1", "table", t.name, "columns", cols, "max_allowed_packet", pl.pair.packet)
	}
	t.plan = plan
	t.handle = newHandleKey(up, plan, pl.pair.flavor[upSide])
	return t, nil
}

// newPlan builds the comparison plan of a table pair: the compared columns are the
// upstream's columns that exist on both sides, are not ignored and are not generated
// downstream (the downstream computes those, fix SQL cannot write them). A column
// generated upstream but plain downstream is compared: the downstream stores its values
// like any other column's. It fails only when nothing can be compared.
func newPlan(up, down *tableSchema, ignored func(string) bool) (*tablePlan, error) {
	if ignored == nil {
		ignored = func(string) bool { return false }
	}
	p := &tablePlan{Schema: [2]string{up.Schema, down.Schema}, Table: [2]string{up.Name, down.Name}, Hash: HashSHA1}
	for _, uc := range up.Columns {
		dc, ok := down.column(uc.Name)
		if !ok || dc.Generated {
			continue
		}
		if ignored(uc.Name) {
			// Not compared, but carried into the rows fix SQL inserts. Long ones too (a
			// LONGBLOB, a JSON document): a NOT NULL column without a default refuses an
			// insert without it, and only the rows of mismatched ranges are read.
			p.Carried = append(p.Carried, planColumn{Name: uc.Name, Kind: uc.Kind, Charset: [2]string{uc.Charset, dc.Charset},
				Collation: [2]string{uc.Collation, dc.Collation}, MaxBytes: max(uc.MaxBytes, dc.MaxBytes)})
			continue
		}
		p.Columns = append(p.Columns, planColumn{Name: uc.Name, Kind: uc.Kind, NotNull: !uc.Nullable && !dc.Nullable,
			Enum:     uc.DataType == "enum" || uc.DataType == "set",
			Unsigned: uc.Kind == kindInt && strings.Contains(uc.ColumnType, "unsigned"),
			Charset:  [2]string{uc.Charset, dc.Charset}, Collation: [2]string{uc.Collation, dc.Collation},
			MaxBytes: max(uc.MaxBytes, dc.MaxBytes)})
	}
	for _, dc := range down.Columns {
		if _, ok := up.column(dc.Name); !ok || ignored(dc.Name) || dc.Generated {
			if !dc.Generated {
				p.PartialColumns = true
			}
		}
	}
	if len(p.Columns) == 0 {
		return nil, errors.New("no column in common: data not compared")
	}
	index := func(name string) int {
		for i, c := range p.Columns {
			if strings.EqualFold(c.Name, name) {
				return i
			}
		}
		return -1
	}
	key, keyless := chooseKey(up, down, ignored)
	if !keyless {
		for _, k := range key {
			p.Key = append(p.Key, index(k))
		}
		return p, nil
	}
	p.Keyless = true
	// Chunks of a keyless table are cut on the columns of an index (so cutting walks the
	// index instead of sorting the table) whose columns are NOT NULL, of orderable types
	// and collated alike on both sides. Equal rows always fall into the same chunk, so
	// duplicates are counted correctly. Without such an index the table is one chunk.
	for _, ix := range up.Indexes {
		var cols []int
		for _, name := range ix {
			i := index(name)
			if i < 0 {
				break
			}
			c := p.Columns[i]
			uc, _ := up.column(c.Name)
			dc, _ := down.column(c.Name)
			if uc.Nullable || dc.Nullable || uc.Kind != dc.Kind {
				break
			}
			ok := false
			switch c.Kind {
			case kindInt, kindDecimal, kindTemporal:
				ok = true
			case kindString:
				ok = !strings.Contains(uc.DataType, "text") && c.Collation[0] == c.Collation[1]
			}
			if !ok {
				break
			}
			cols = append(cols, i)
		}
		if len(cols) > 0 {
			p.Key = cols
			break
		}
	}
	return p, nil
}
