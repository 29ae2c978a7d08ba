package cdc

// streamschema.go completes the rows of protocols whose messages do not say what the
// applier needs of a table (canal-json): which columns form the handle key (canal-json's
// pkNames lists primary-key columns only, so a table keyed by a NOT NULL unique key
// arrives without a key), which are generated (never written downstream) and which
// belong to other unique indexes. The definition of each table is taken, in this order:
//
//  1. from the changefeed's own DDLs: every CREATE TABLE, ALTER TABLE, CREATE/DROP INDEX,
//     RENAME, DROP the stream carries is parsed with TiDB's parser and kept as a version
//     at its commit ts; a row at ts uses the last version before ts. canal-json sends
//     DDLs to partition 0 only, so a row read from another partition waits until
//     partition 0 of its topic has been read to ts (a watermark, DDL or row at ts or
//     later: TiCDC writes a DDL after every row before it and before every row after
//     it), which makes the version exact whatever order the readers run in;
//  2. for a table the stream has not defined (created before the changefeed, or before
//     the part of it read since the last checkpoint): from the upstream TiDB at the row's
//     commit ts when upstream.dsn is set (information_schema under @@tidb_snapshot, as
//     handle-key-only rows are read), else from the fallback's current definition.
//
// Flags are computed as TiCDC computes them (cdc/upstream NewTable/LoadTable); a row's
// values and type codes stay as the message gave them.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/pingcap/tidb/pkg/parser"
	"github.com/pingcap/tidb/pkg/parser/ast"
	"github.com/pingcap/tidb/pkg/parser/model"
	"github.com/pingcap/tidb/pkg/parser/mysql"
	"github.com/pingcap/tidb/pkg/parser/types"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/cdc/upstream"
)

// tableDef is a table as the stream's DDLs define it.
type tableDef struct {
	cols []upstream.ColumnDef
	idxs []upstream.IndexDef
}

func (d *tableDef) clone() *tableDef {
	c := &tableDef{cols: slices.Clone(d.cols)}
	for _, ix := range d.idxs {
		ix.Columns = slices.Clone(ix.Columns)
		c.idxs = append(c.idxs, ix)
	}
	return c
}

func (d *tableDef) col(name string) int {
	return slices.IndexFunc(d.cols, func(c upstream.ColumnDef) bool { return strings.EqualFold(c.Name, name) })
}

// schemaVersion is a table's definition from commit ts on; tbl nil with unknown false
// means the table does not exist (dropped or renamed away).
type schemaVersion struct {
	ts      uint64
	def     *tableDef
	tbl     *upstream.Table
	unknown bool // changed by a DDL the stream carried, but never defined by it
}

// streamSchemas is shared by the readers of every partition.
type streamSchemas struct {
	// below: rows at or below it are not completed (the checkpoint at start: they are
	// dropped as applied).
	below uint64
	// fallback reads a table the stream has not defined, as of ts.
	fallback func(ctx context.Context, schema, table string, ts uint64) (*upstream.Table, error)
	// defs (nil: none) reads the definition a DDL of a table the stream has not defined
	// starts from (streamschema_base.go); done lists the DDLs at below that ran.
	defs func(ctx context.Context, schema, table string, ts uint64) (*tableDef, error)
	done map[ddlKey]bool

	mu    sync.Mutex
	wake  chan struct{}     // closed when progress advances
	seen  map[string]uint64 // topic → highest ts read from its partition 0
	hist  map[tableKey][]schemaVersion
	ddls  map[ddlKey]bool
	cache map[tableKey]cachedTable // fallback reads, dropped at every DDL
	base  map[tableKey]*tableDef   // while a DDL is recorded: what it starts from (bases)
}

func newStreamSchemas(below uint64, fallback func(ctx context.Context, schema, table string, ts uint64) (*upstream.Table, error)) *streamSchemas {
	return &streamSchemas{below: below, fallback: fallback, wake: make(chan struct{}), seen: map[string]uint64{},
		hist: map[tableKey][]schemaVersion{}, ddls: map[ddlKey]bool{}, cache: map[tableKey]cachedTable{}}
}

// complete records the DDLs of one record of partition pk, then sets the key, generated
// and nullable flags of its rows from their tables' definitions.
func (s *streamSchemas) complete(ctx context.Context, pk partKey, evs []open.Event) error {
	var top uint64
	for i := range evs {
		ev := &evs[i]
		top = max(top, ev.CommitTs)
		if ev.Kind == open.KindDDL {
			if err := s.ddl(ctx, ev); err != nil {
				return fmt.Errorf("tracking the table definitions of DDL %q at commit ts %d: %w", ev.Query, ev.CommitTs, err)
			}
		}
	}
	if pk.Partition == 0 {
		s.advance(pk.Topic, top)
	}
	for i := range evs {
		ev := &evs[i]
		if ev.Kind != open.KindRow || ev.CommitTs <= s.below {
			continue
		}
		t, err := s.table(ctx, pk, ev.Schema, ev.Table, ev.CommitTs)
		if err != nil {
			return err
		}
		for _, cols := range [2][]open.Column{ev.Columns, ev.OldColumns} {
			for j := range cols {
				c := &cols[j]
				p := t.Col(c.Name)
				if p < 0 {
					return fmt.Errorf("row of %s.%s at commit ts %d has column %s, which the table's definition lacks", ev.Schema, ev.Table, ev.CommitTs, c.Name)
				}
				const msg = open.FlagBinary | open.FlagUnsigned // what the message itself says
				c.Flags = c.Flags&msg | t.Columns[p].Flags&^msg
			}
		}
	}
	return nil
}

func (s *streamSchemas) advance(topic string, ts uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ts > s.seen[topic] {
		s.seen[topic] = ts
		close(s.wake)
		s.wake = make(chan struct{})
	}
}

// table returns the definition of schema.table for a row at ts read from pk.
func (s *streamSchemas) table(ctx context.Context, pk partKey, schema, table string, ts uint64) (*upstream.Table, error) {
	for {
		s.mu.Lock()
		if pk.Partition == 0 || s.seen[pk.Topic] >= ts {
			break
		}
		wake := s.wake
		s.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	k := tableKey{schema, table}
	vs := s.hist[k]
	i := len(vs) - 1
	for i >= 0 && vs[i].ts >= ts {
		i--
	}
	if i >= 0 && !vs[i].unknown {
		v := vs[i]
		s.mu.Unlock()
		if v.tbl == nil {
			return nil, fmt.Errorf("row of %s.%s at commit ts %d: the changefeed dropped or renamed the table at commit ts %d", schema, table, ts, v.ts)
		}
		return v.tbl, nil
	}
	c, ok := s.cache[k]
	s.mu.Unlock()
	if ok && ts >= c.lo {
		return c.t, nil
	}
	t, err := s.fallback(ctx, schema, table, ts)
	if err != nil {
		return nil, fmt.Errorf("reading the definition of %s.%s (not created by the changefeed's DDLs read so far) for a row at commit ts %d: %w", schema, table, ts, err)
	}
	s.mu.Lock()
	if !ok {
		s.cache[k] = cachedTable{t: t, lo: ts}
	}
	s.mu.Unlock()
	return t, nil
}

// ddl records the table definitions a DDL leaves.
func (s *streamSchemas) ddl(ctx context.Context, ev *open.Event) error {
	k := newDDLKey(ev.CommitTs, ev.Query)
	s.mu.Lock()
	seen := s.ddls[k]
	s.mu.Unlock()
	if seen {
		return nil
	}
	stmts, _, err := parser.New().ParseSQL(ev.Query)
	if err != nil {
		return err
	}
	base, err := s.bases(ctx, k, ev, stmts)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ddls[k] { // another partition's copy was recorded meanwhile
		return nil
	}
	s.ddls[k] = true
	clear(s.cache)
	s.base = base
	defer func() { s.base = nil }()
	for _, st := range stmts {
		if err := s.stmt(st, ev.Schema, ev.CommitTs); err != nil {
			return err
		}
	}
	return nil
}

// latest returns a table's latest definition: the stream's, else the one read for the
// DDL being recorded (bases); nil when neither (unknown, or dropped). fromBase says
// it is the one read.
func (s *streamSchemas) latest(k tableKey) (def *tableDef, fromBase bool) {
	if cur := s.current(k); cur != nil && (cur.def != nil || !cur.unknown) {
		return cur.def, false
	}
	d := s.base[k]
	return d, d != nil
}

// current returns the latest version of a table (nil when none).
func (s *streamSchemas) current(k tableKey) *schemaVersion {
	vs := s.hist[k]
	if len(vs) == 0 {
		return nil
	}
	return &vs[len(vs)-1]
}

// set records a table's definition from ts: def nil drops it; unknown says the stream
// changed a table it never defined.
func (s *streamSchemas) set(k tableKey, ts uint64, def *tableDef, unknown bool) error {
	v := schemaVersion{ts: ts, def: def, unknown: unknown}
	if def != nil {
		t, err := upstream.NewTable(k.Schema, k.Table, def.cols, def.idxs)
		if err != nil {
			return err
		}
		v.tbl = t
	}
	vs := s.hist[k]
	for len(vs) > 0 && vs[len(vs)-1].ts >= ts { // a DDL of one ts twice: the last wins
		vs = vs[:len(vs)-1]
	}
	s.hist[k] = append(vs, v)
	return nil
}

func (s *streamSchemas) stmt(st ast.StmtNode, schema string, ts uint64) error {
	name := func(tn *ast.TableName) tableKey {
		if tn.Schema.O != "" {
			return tableKey{tn.Schema.O, tn.Name.O}
		}
		return tableKey{schema, tn.Name.O}
	}
	// alter edits a copy of the table's latest definition.
	alter := func(k tableKey, fn func(d *tableDef) error) error {
		cur, fromBase := s.latest(k)
		if cur == nil {
			return s.set(k, ts, nil, true)
		}
		d := cur.clone()
		if err := fn(d); err != nil {
			if fromBase { // the definition read already had the DDL's effect: read it again for rows
				return s.set(k, ts, nil, true)
			}
			return fmt.Errorf("table %s.%s: %w", k.Schema, k.Table, err)
		}
		return s.set(k, ts, d, false)
	}
	switch st := st.(type) {
	case *ast.CreateTableStmt:
		k := name(st.Table)
		if st.ReferTable != nil {
			src, _ := s.latest(name(st.ReferTable))
			if src == nil {
				return s.set(k, ts, nil, true)
			}
			return s.set(k, ts, src.clone(), false)
		}
		d := &tableDef{}
		for _, cd := range st.Cols {
			if err := addColumn(d, cd, nil); err != nil {
				return fmt.Errorf("table %s.%s: %w", k.Schema, k.Table, err)
			}
		}
		for _, c := range st.Constraints {
			addConstraint(d, c)
		}
		return s.set(k, ts, d, false)
	case *ast.AlterTableStmt:
		k := name(st.Table)
		for _, sp := range st.Specs {
			if sp.Tp == ast.AlterTableRenameTable {
				cur, _ := s.latest(k)
				nk := name(sp.NewTable)
				if err := s.set(k, ts, nil, false); err != nil {
					return err
				}
				if cur == nil {
					if err := s.set(nk, ts, nil, true); err != nil {
						return err
					}
				} else if err := s.set(nk, ts, cur, false); err != nil {
					return err
				}
				k = nk
				continue
			}
			if err := alter(k, func(d *tableDef) error { return alterSpec(d, sp) }); err != nil {
				return err
			}
		}
	case *ast.RenameTableStmt:
		for _, tt := range st.TableToTables {
			from, to := name(tt.OldTable), name(tt.NewTable)
			cur, _ := s.latest(from)
			if err := s.set(from, ts, nil, false); err != nil {
				return err
			}
			if cur == nil {
				if err := s.set(to, ts, nil, true); err != nil {
					return err
				}
			} else if err := s.set(to, ts, cur, false); err != nil {
				return err
			}
		}
	case *ast.DropTableStmt:
		if !st.IsView {
			for _, tn := range st.Tables {
				if err := s.set(name(tn), ts, nil, false); err != nil {
					return err
				}
			}
		}
	case *ast.DropDatabaseStmt:
		for k := range s.hist {
			if strings.EqualFold(k.Schema, st.Name.O) {
				if err := s.set(k, ts, nil, false); err != nil {
					return err
				}
			}
		}
	case *ast.CreateIndexStmt:
		return alter(name(st.Table), func(d *tableDef) error {
			ix := upstream.IndexDef{Name: st.IndexName, Unique: st.KeyType == ast.IndexKeyTypeUnique}
			for _, p := range st.IndexPartSpecifications {
				if p.Column != nil {
					ix.Columns = append(ix.Columns, p.Column.Name.O)
				}
			}
			d.idxs = append(d.idxs, ix)
			return nil
		})
	case *ast.DropIndexStmt:
		return alter(name(st.Table), func(d *tableDef) error {
			dropIndex(d, st.IndexName)
			return nil
		})
	}
	return nil // TRUNCATE, CREATE DATABASE and the rest change no table definition
}

// columnDef turns a parsed column definition into the tracker's; idx collects the
// indexes its options declare.
func addColumn(d *tableDef, cd *ast.ColumnDef, pos *ast.ColumnPosition) error {
	tp := cd.Tp
	c := upstream.ColumnDef{Name: cd.Name.Name.O, DataType: types.TypeToStr(tp.GetType(), tp.GetCharset()),
		Unsigned: mysql.HasUnsignedFlag(tp.GetFlag()), Nullable: true}
	if d.col(c.Name) >= 0 {
		return fmt.Errorf("column %s twice", c.Name)
	}
	for _, o := range cd.Options {
		switch o.Tp {
		case ast.ColumnOptionNotNull:
			c.Nullable = false
		case ast.ColumnOptionPrimaryKey:
			c.Nullable = false
			d.idxs = append(d.idxs, upstream.IndexDef{Name: "PRIMARY", Primary: true, Unique: true, Columns: []string{c.Name}})
		case ast.ColumnOptionUniqKey:
			d.idxs = append(d.idxs, upstream.IndexDef{Name: c.Name, Unique: true, Columns: []string{c.Name}})
		case ast.ColumnOptionGenerated:
			c.Generated = true
		}
	}
	at := len(d.cols)
	if pos != nil {
		switch pos.Tp {
		case ast.ColumnPositionFirst:
			at = 0
		case ast.ColumnPositionAfter:
			if p := d.col(pos.RelativeColumn.Name.O); p >= 0 {
				at = p + 1
			}
		}
	}
	d.cols = slices.Insert(d.cols, at, c)
	return nil
}

func addConstraint(d *tableDef, c *ast.Constraint) {
	ix := upstream.IndexDef{Name: c.Name}
	switch c.Tp {
	case ast.ConstraintPrimaryKey:
		ix.Name, ix.Primary, ix.Unique = "PRIMARY", true, true
	case ast.ConstraintUniq, ast.ConstraintUniqKey, ast.ConstraintUniqIndex:
		ix.Unique = true
	case ast.ConstraintKey, ast.ConstraintIndex:
	default:
		return // foreign keys, checks, full-text and vector indexes give no key
	}
	for _, p := range c.Keys {
		if p.Column == nil {
			continue // an expression part
		}
		ix.Columns = append(ix.Columns, p.Column.Name.O)
		if ix.Primary {
			if i := d.col(p.Column.Name.O); i >= 0 {
				d.cols[i].Nullable = false
			}
		}
	}
	if ix.Name == "" && len(ix.Columns) > 0 {
		ix.Name = ix.Columns[0]
	}
	d.idxs = append(d.idxs, ix)
}

func dropIndex(d *tableDef, name string) {
	d.idxs = slices.DeleteFunc(d.idxs, func(ix upstream.IndexDef) bool { return strings.EqualFold(ix.Name, name) })
}

// renameColumn renames a column in the table and its indexes.
func renameColumn(d *tableDef, from, to string) {
	if i := d.col(from); i >= 0 {
		d.cols[i].Name = to
	}
	for _, ix := range d.idxs {
		for j, c := range ix.Columns {
			if strings.EqualFold(c, from) {
				ix.Columns[j] = to
			}
		}
	}
}

func alterSpec(d *tableDef, sp *ast.AlterTableSpec) error {
	switch sp.Tp {
	case ast.AlterTableAddColumns:
		for _, cd := range sp.NewColumns {
			if sp.IfNotExists && d.col(cd.Name.Name.O) >= 0 {
				continue
			}
			if err := addColumn(d, cd, sp.Position); err != nil {
				return err
			}
		}
		for _, c := range sp.NewConstraints {
			addConstraint(d, c)
		}
	case ast.AlterTableDropColumn:
		n := sp.OldColumnName.Name.O
		if i := d.col(n); i >= 0 {
			d.cols = slices.Delete(d.cols, i, i+1)
		}
		for i := range d.idxs {
			d.idxs[i].Columns = slices.DeleteFunc(d.idxs[i].Columns, func(c string) bool { return strings.EqualFold(c, n) })
		}
		d.idxs = slices.DeleteFunc(d.idxs, func(ix upstream.IndexDef) bool { return len(ix.Columns) == 0 })
	case ast.AlterTableModifyColumn, ast.AlterTableChangeColumn:
		old := sp.NewColumns[0].Name.Name.O
		if sp.OldColumnName != nil {
			old = sp.OldColumnName.Name.O
		}
		i := d.col(old)
		if i < 0 {
			return fmt.Errorf("no column %s to change", old)
		}
		// The column keeps its indexes (under its new name); its own options may add more.
		keepNull := false
		for _, ix := range d.idxs {
			if ix.Primary && slices.ContainsFunc(ix.Columns, func(c string) bool { return strings.EqualFold(c, old) }) {
				keepNull = true
			}
		}
		renameColumn(d, old, sp.NewColumns[0].Name.Name.O)
		d.cols = slices.Delete(d.cols, i, i+1)
		pos := sp.Position
		if pos == nil || pos.Tp == ast.ColumnPositionNone {
			pos = &ast.ColumnPosition{Tp: ast.ColumnPositionFirst}
			if i > 0 {
				pos = &ast.ColumnPosition{Tp: ast.ColumnPositionAfter, RelativeColumn: &ast.ColumnName{Name: model.NewCIStr(d.cols[i-1].Name)}}
			}
		}
		if err := addColumn(d, sp.NewColumns[0], pos); err != nil {
			return err
		}
		if keepNull {
			d.cols[d.col(sp.NewColumns[0].Name.Name.O)].Nullable = false
		}
	case ast.AlterTableRenameColumn:
		renameColumn(d, sp.OldColumnName.Name.O, sp.NewColumnName.Name.O)
	case ast.AlterTableAddConstraint:
		addConstraint(d, sp.Constraint)
	case ast.AlterTableDropIndex:
		dropIndex(d, sp.Name)
	case ast.AlterTableDropPrimaryKey:
		dropIndex(d, "PRIMARY")
	case ast.AlterTableRenameIndex:
		for i := range d.idxs {
			if strings.EqualFold(d.idxs[i].Name, sp.FromKey.O) {
				d.idxs[i].Name = sp.ToKey.O
			}
		}
	}
	return nil
}
