package checker

import (
	"fmt"
	"strings"

	"github.com/tidb-parity/parity/internal/ident"
)

// Fix SQL makes the downstream equal to the upstream. Statements are written per table in
// two groups, deletes first: under a _ci key, a row whose key differs only in case is
// reported as one extra and one missing row, and deleting before inserting keeps the
// insert. Values are literals that do not depend on the session's sql_mode.

func (p *TablePlan) keyFor(row []Value) Key {
	idx := p.Key
	if p.Keyless {
		idx = make([]int, len(p.Columns))
		for i := range idx {
			idx[i] = i
		}
	}
	k := make(Key, len(idx))
	for i, c := range idx {
		k[i] = KeyValue{Column: p.Columns[c].Name, Value: Literal(p.Columns[c].Kind, row[c])}
	}
	return k
}

func (p *TablePlan) columnList() string {
	names := make([]string, len(p.Columns))
	for i, c := range p.Columns {
		names[i] = ident.Quote(c.Name)
	}
	return strings.Join(names, ", ")
}

func (p *TablePlan) valueList(row []Value) string {
	vals := make([]string, len(p.Columns))
	for i, c := range p.Columns {
		vals[i] = Literal(c.Kind, row[i])
	}
	return strings.Join(vals, ", ")
}

// upsert writes the upstream row: REPLACE when every downstream column is compared,
// otherwise INSERT ... ON DUPLICATE KEY UPDATE so ignored columns keep their values.
func (p *TablePlan) upsert(row []Value) string {
	t := p.table(Downstream)
	if !p.PartialColumns {
		return fmt.Sprintf("REPLACE INTO %s (%s) VALUES (%s);", t, p.columnList(), p.valueList(row))
	}
	sets := make([]string, 0, len(p.Columns))
	for _, c := range p.Columns {
		sets = append(sets, ident.Quote(c.Name)+" = VALUES("+ident.Quote(c.Name)+")")
	}
	return fmt.Sprintf("INSERT INTO %s (%s) VALUES (%s) ON DUPLICATE KEY UPDATE %s;", t, p.columnList(), p.valueList(row), strings.Join(sets, ", "))
}

func (p *TablePlan) missing(row []Value, n int) Difference {
	d := Difference{Kind: Missing, Key: p.keyFor(row)}
	if p.Keyless {
		stmt := fmt.Sprintf("INSERT INTO %s (%s) VALUES (%s);", p.table(Downstream), p.columnList(), p.valueList(row))
		d.fix = strings.TrimSuffix(strings.Repeat(stmt+"\n", n), "\n")
		if n > 1 {
			d.Count = n
		}
		return d
	}
	d.fix = p.upsert(row)
	return d
}

func (p *TablePlan) differing(row []Value, cols []string) Difference {
	return Difference{Kind: Differing, Key: p.keyFor(row), Columns: cols, fix: p.upsert(row)}
}

func (p *TablePlan) extra(row []Value, n int) Difference {
	d := Difference{Kind: Extra, Key: p.keyFor(row)}
	var conds []string
	if p.Keyless {
		// Exact-row delete: NULL-safe equality on every column, as many copies as extra.
		for i, c := range p.Columns {
			conds = append(conds, ident.Quote(c.Name)+" <=> "+Literal(c.Kind, row[i]))
		}
		if n > 1 {
			d.Count = n
		}
	} else {
		for _, k := range p.Key {
			c := p.Columns[k]
			conds = append(conds, ident.Quote(c.Name)+" = "+Literal(c.Kind, row[k]))
		}
	}
	d.fix = fmt.Sprintf("DELETE FROM %s WHERE %s LIMIT %d;", p.table(Downstream), strings.Join(conds, " AND "), n)
	return d
}

// fixHeader starts a table's fix file.
func (p *TablePlan) fixHeader(runID string) string {
	return fmt.Sprintf("-- parity diff run %s: make %s equal to upstream %s.\n-- Review before applying. Deletes come first.\nSET SESSION time_zone = '+00:00';\n",
		runID, p.table(Downstream), p.table(Upstream))
}
