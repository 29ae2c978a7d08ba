package checker

// rowdiff.go is the comparer's row comparison: streaming both sides' rows in key order and
// merging them, type-aware equality (canon), and the multiset comparison of a keyless
// range. It must not store or count what it finds: differences go to the emit it is given.

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"

	"github.com/tidb-parity/parity/internal/rowkey"
)

// DiffKind classifies a row difference.
type DiffKind string

const (
	// Missing: the row exists upstream but not downstream.
	Missing DiffKind = "missing"
	// Extra: the row exists downstream but not upstream.
	Extra DiffKind = "extra"
	// Differing: the row exists on both sides with different values in Columns.
	Differing DiffKind = "differing"
)

// KeyValue is one column of a difference's key, its value as SQL text.
type KeyValue struct {
	Column string
	Value  string
}

// Key is an ordered column→value map; it marshals as a JSON object in key order.
type Key []KeyValue

func (k Key) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, kv := range k {
		if i > 0 {
			b.WriteByte(',')
		}
		name, _ := json.Marshal(kv.Column)
		val, _ := json.Marshal(kv.Value)
		b.Write(name)
		b.WriteByte(':')
		b.Write(val)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func (k *Key) UnmarshalJSON(data []byte) error {
	// Order is restored from the token stream.
	dec := json.NewDecoder(bytes.NewReader(data))
	if _, err := dec.Token(); err != nil {
		return err
	}
	*k = nil
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		var v string
		if err := dec.Decode(&v); err != nil {
			return err
		}
		*k = append(*k, KeyValue{Column: t.(string), Value: v})
	}
	return nil
}

// Difference is one differing row.
type Difference struct {
	Kind DiffKind `json:"kind"`
	// Key identifies the row: the key columns, or every column of a keyless table. Values
	// are SQL literals of the upstream value (downstream for extra rows).
	Key Key `json:"key"`
	// Columns names the differing columns of a Differing row.
	Columns []string `json:"columns,omitempty"`
	// Count is how many copies of a keyless row are missing or extra (omitted when 1).
	Count int `json:"count,omitempty"`
	// Class says where the difference comes from (classify.go): imported, post-import or
	// cdc at a snapshot pair, diverged when the sides were not read at one, unclassified
	// when the changefeed's ledger cannot tell. Stored in its own column
	// (diff_differences.class), not in the stored JSON.
	Class string `json:"class,omitempty"`

	fix string     // fix SQL statement(s)
	rk  rowkey.Key // the exact key (keys.go); nil when stored by an earlier release
}

// canon returns a canonical form of v for kind k: two values are equal exactly when their
// canonical forms are. Strings and binaries compare by bytes (so 'a' and 'A' differ even in
// a _ci column: a checker must report what a byte-level reader would see). FLOAT and
// DOUBLE compare exactly: both are read as DOUBLE text (selectExpr; a FLOAT widened
// exactly), parsed to float64 and compared bit for bit, except that -0 equals 0 (as in the
// checksum SQL, see floatText; NaN cannot be stored). DECIMAL by value (1.5 = 1.50), BIT by value, JSON by structure (key order, spacing and
// number spelling ignored).
func canon(k colKind, v sqlValue) string {
	if v.Null {
		return "\x00NULL"
	}
	s := string(v.Bytes)
	switch k {
	case kindFloat, kindDouble:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return s
		}
		if f == 0 {
			return "0" // -0 too
		}
		// The shortest text that parses back to f: one text per float64 value.
		return strconv.FormatFloat(f, 'g', -1, 64)
	case kindDecimal:
		r, ok := new(big.Rat).SetString(s)
		if !ok {
			return s
		}
		return r.RatString()
	case kindInt, kindBit:
		i, ok := new(big.Int).SetString(s, 10)
		if !ok {
			return s
		}
		return i.String()
	case kindJSON:
		var x any
		dec := json.NewDecoder(strings.NewReader(s))
		dec.UseNumber()
		if err := dec.Decode(&x); err != nil {
			return s
		}
		var b strings.Builder
		canonJSON(&b, x)
		return b.String()
	}
	return s
}

func canonJSON(b *strings.Builder, x any) {
	switch v := x.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			kb, _ := json.Marshal(k)
			b.Write(kb)
			b.WriteByte(':')
			canonJSON(b, v[k])
		}
		b.WriteByte('}')
	case []any:
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			canonJSON(b, e)
		}
		b.WriteByte(']')
	case json.Number:
		if r, ok := new(big.Rat).SetString(string(v)); ok {
			b.WriteString(r.RatString())
		} else if f, err := strconv.ParseFloat(string(v), 64); err == nil && !math.IsInf(f, 0) {
			b.WriteString(strconv.FormatFloat(f, 'g', -1, 64))
		} else {
			b.WriteString(string(v))
		}
	default:
		kb, _ := json.Marshal(v)
		b.Write(kb)
	}
}

// rowStream reads rows of a plan's columns, as text, from *sql.Rows or straight from the
// driver (newDriverRowStream).
type rowStream struct {
	rows *sql.Rows
	raw  []sql.RawBytes
	ptrs []any

	drv     driver.Rows    // set instead of rows when reading from the driver
	vals    []driver.Value // its current row
	scratch [][]byte       // per column: the text of a number the driver parsed

	cur  []sqlValue
	done bool
	read int64 // rows read so far
}

func newRowStream(rows *sql.Rows, n int) *rowStream {
	s := &rowStream{rows: rows, raw: make([]sql.RawBytes, n), ptrs: make([]any, n), cur: make([]sqlValue, n)}
	for i := range s.raw {
		s.ptrs[i] = &s.raw[i]
	}
	return s
}

// newDriverRowStream reads rows from the driver itself, without database/sql's locking and
// conversions per value: per 350,000 four-column sysbench rows from MariaDB, 0.24-0.27 s of
// parity's CPU against 0.33-0.38 s through *sql.Rows.
func newDriverRowStream(rows driver.Rows, n int) *rowStream {
	return &rowStream{drv: rows, vals: make([]driver.Value, n), scratch: make([][]byte, n), cur: make([]sqlValue, n)}
}

// next advances; the current row stays valid until the following call.
func (s *rowStream) next() error {
	if s.done {
		return nil
	}
	if s.drv != nil {
		return s.nextDriver()
	}
	if !s.rows.Next() {
		s.done = true
		return s.rows.Err()
	}
	if err := s.rows.Scan(s.ptrs...); err != nil {
		return err
	}
	s.read++
	for i, r := range s.raw {
		if r == nil {
			s.cur[i] = nullValue
		} else {
			s.cur[i] = sqlValue{Bytes: r}
		}
	}
	return nil
}

// nextDriver is next on driver rows. The MySQL driver hands text values over as bytes of
// its read buffer (valid until its next Next) and parses integer and floating-point
// columns; those are printed back exactly as database/sql prints them into RawBytes
// (strconv, shortest form that round-trips).
func (s *rowStream) nextDriver() error {
	if err := s.drv.Next(s.vals); err != nil {
		s.done = true
		if err == io.EOF {
			return nil
		}
		return err
	}
	s.read++
	for i, v := range s.vals {
		b := s.scratch[i][:0]
		switch v := v.(type) {
		case nil:
			s.cur[i] = nullValue
			continue
		case []byte:
			s.cur[i] = sqlValue{Bytes: v}
			continue
		case int64:
			b = strconv.AppendInt(b, v, 10)
		case uint64:
			b = strconv.AppendUint(b, v, 10)
		case float64:
			b = strconv.AppendFloat(b, v, 'g', -1, 64)
		case float32:
			b = strconv.AppendFloat(b, float64(v), 'g', -1, 32)
		case string:
			b = append(b, v...)
		default:
			return fmt.Errorf("column %d: unexpected driver value of type %T", i, v)
		}
		s.scratch[i] = b
		s.cur[i] = sqlValue{Bytes: b}
	}
	return nil
}

func (s *rowStream) row() []sqlValue {
	out := make([]sqlValue, len(s.cur))
	for i, v := range s.cur {
		out[i] = v.clone()
	}
	return out
}

// compareRowKeys orders two full rows (rangeRowsSQL's columns, in plan order) by key, like
// compareKeys of their key values, without copying the keys.
func (p *tablePlan) compareRowKeys(a, b []sqlValue) int {
	for _, k := range p.Key {
		if c := compareValue(p.Columns[k].Kind, a[k], b[k]); c != 0 {
			return c
		}
	}
	return 0
}

// differingColumns returns the names of the columns whose canonical values differ.
func (p *tablePlan) differingColumns(up, down []sqlValue) []string {
	var out []string
	for i, c := range p.Columns {
		if up[i].Null == down[i].Null && bytes.Equal(up[i].Bytes, down[i].Bytes) {
			continue // same bytes: equal under every rule
		}
		if canon(c.Kind, up[i]) != canon(c.Kind, down[i]) {
			out = append(out, c.Name)
		}
	}
	return out
}

// mergeRows streams both sides of range r in key order and reports every difference to
// emit. Memory: two rows at a time.
func (c *comparer) mergeRows(ctx context.Context, t *target, rng keyRange, emit func(Difference) error) error {
	p := t.plan
	return c.mergeQueries(ctx, t, p.rangeRowsSQL(upSide, rng), p.rangeRowsSQL(downSide, rng), emit)
}

// mergeRanges merge-compares the rows of several disjoint ranges, given in key order,
// with one row query per side over all of them.
func (c *comparer) mergeRanges(ctx context.Context, t *target, rngs []keyRange, emit func(Difference) error) error {
	switch len(rngs) {
	case 0:
		return nil
	case 1:
		return c.mergeRows(ctx, t, rngs[0], emit)
	}
	p := t.plan
	return c.mergeQueries(ctx, t, p.rowsInRangesSQL(upSide, rngs), p.rowsInRangesSQL(downSide, rngs), emit)
}

// mergeQueries merge-compares the rows of two queries in rangeRowsSQL's columns and order.
func (c *comparer) mergeQueries(ctx context.Context, t *target, uSQL, dSQL string, emit func(Difference) error) error {
	_, err := c.mergeCounted(ctx, t, uSQL, dSQL, emit)
	return err
}

// mergeCounted is mergeQueries, returning the rows read on each side.
func (c *comparer) mergeCounted(ctx context.Context, t *target, uSQL, dSQL string, emit func(Difference) error) (rows [2]int64, err error) {
	p := t.plan
	count := func(us, ds *rowStream) { rows = [2]int64{us.read, ds.read} }
	err = c.pair.withBoth(ctx, func(ctx context.Context, uq, dq Querier) error {
		err := withDriverRows(ctx, t.name, uq, dq, uSQL, dSQL, p.width(upSide), p.width(downSide), func(us, ds *rowStream) error {
			defer count(us, ds)
			return mergeStreams(t, us, ds, emit)
		})
		if !errors.Is(err, errNoDriverQuery) {
			return err
		}
		urows, err := uq.QueryContext(ctx, uSQL)
		if err != nil {
			return fmt.Errorf("read upstream rows of %s: %w", t.name, err)
		}
		defer urows.Close()
		drows, err := dq.QueryContext(ctx, dSQL)
		if err != nil {
			return fmt.Errorf("read downstream rows of %s: %w", t.name, err)
		}
		defer drows.Close()
		us, ds := newRowStream(urows, p.width(upSide)), newRowStream(drows, p.width(downSide))
		defer count(us, ds)
		return mergeStreams(t, us, ds, emit)
	})
	return rows, err
}

// errNoDriverQuery: a side's connection cannot be queried at the driver level.
var errNoDriverQuery = errors.New("no driver-level query")

// withDriverRows runs the two queries on the drivers of connections uq and dq and hands
// their row streams (of nu and nd values per row) to fn. It returns errNoDriverQuery
// (having run nothing) unless both are *sql.Conn over drivers that implement
// driver.QueryerContext.
func withDriverRows(ctx context.Context, table string, uq, dq Querier, uSQL, dSQL string, nu, nd int, fn func(us, ds *rowStream) error) error {
	uc, ok1 := uq.(*sql.Conn)
	dc, ok2 := dq.(*sql.Conn)
	if !ok1 || !ok2 {
		return errNoDriverQuery
	}
	return uc.Raw(func(ud any) error {
		return dc.Raw(func(dd any) error {
			uqc, ok1 := ud.(driver.QueryerContext)
			dqc, ok2 := dd.(driver.QueryerContext)
			if !ok1 || !ok2 {
				return errNoDriverQuery
			}
			urows, err := uqc.QueryContext(ctx, uSQL, nil)
			if err != nil {
				return fmt.Errorf("read upstream rows of %s: %w", table, err)
			}
			defer urows.Close()
			drows, err := dqc.QueryContext(ctx, dSQL, nil)
			if err != nil {
				return fmt.Errorf("read downstream rows of %s: %w", table, err)
			}
			defer drows.Close()
			return fn(newDriverRowStream(urows, nu), newDriverRowStream(drows, nd))
		})
	})
}

// mergeStreams merge-compares two row streams in key order and emits the differences.
func mergeStreams(t *target, us, ds *rowStream, emit func(Difference) error) error {
	p := t.plan
	if err := us.next(); err != nil {
		return fmt.Errorf("read upstream rows of %s: %w", t.name, err)
	}
	if err := ds.next(); err != nil {
		return fmt.Errorf("read downstream rows of %s: %w", t.name, err)
	}
	for !us.done || !ds.done {
		var c int
		switch {
		case us.done:
			c = 1
		case ds.done:
			c = -1
		default:
			c = p.compareRowKeys(us.cur, ds.cur)
		}
		switch {
		case c < 0:
			if err := emit(p.missing(us.row(), 1)); err != nil {
				return err
			}
			if err := us.next(); err != nil {
				return fmt.Errorf("read upstream rows of %s: %w", t.name, err)
			}
		case c > 0:
			if err := emit(p.extra(ds.row(), 1)); err != nil {
				return err
			}
			if err := ds.next(); err != nil {
				return fmt.Errorf("read downstream rows of %s: %w", t.name, err)
			}
		default:
			if cols := p.differingColumns(us.cur, ds.cur); len(cols) > 0 {
				if err := emit(p.differing(us.row(), cols)); err != nil {
					return err
				}
			}
			if err := us.next(); err != nil {
				return fmt.Errorf("read upstream rows of %s: %w", t.name, err)
			}
			if err := ds.next(); err != nil {
				return fmt.Errorf("read downstream rows of %s: %w", t.name, err)
			}
		}
	}
	return nil
}

type hashGroup struct {
	h string
	n int64
}

// diffKeyless compares range r of a keyless table as two multisets of rows: it merges the
// (row hash, count) groups of both sides, fetches the rows of every group whose counts
// differ, pairs up rows that are equal by type-aware comparison (their SQL encodings may
// differ across servers, e.g. JSON spelling), and reports the rest as missing or extra
// with their multiplicity. keep, when set, says how many of n differing copies of a row
// to report (the re-check reports a row only as often as it was found before).
func (c *comparer) diffKeyless(ctx context.Context, t *target, rng keyRange, emit func(Difference) error, keep func(kind DiffKind, row []sqlValue, n int64) int64) error {
	p := t.plan
	var upOnly, downOnly []hashGroup
	err := c.pair.withBoth(ctx, func(ctx context.Context, uq, dq Querier) error {
		urows, err := uq.QueryContext(ctx, p.hashGroupsSQL(upSide, rng))
		if err != nil {
			return fmt.Errorf("read upstream row hashes of %s: %w", t.name, err)
		}
		defer urows.Close()
		drows, err := dq.QueryContext(ctx, p.hashGroupsSQL(downSide, rng))
		if err != nil {
			return fmt.Errorf("read downstream row hashes of %s: %w", t.name, err)
		}
		defer drows.Close()
		readGroup := func(rows *sql.Rows) (*hashGroup, *big.Int, error) {
			if !rows.Next() {
				return nil, nil, rows.Err()
			}
			var g hashGroup
			if err := rows.Scan(&g.h, &g.n); err != nil {
				return nil, nil, err
			}
			v, _ := new(big.Int).SetString(g.h, 10)
			return &g, v, nil
		}
		ug, uv, err := readGroup(urows)
		if err != nil {
			return fmt.Errorf("read upstream row hashes of %s: %w", t.name, err)
		}
		dg, dv, err := readGroup(drows)
		if err != nil {
			return fmt.Errorf("read downstream row hashes of %s: %w", t.name, err)
		}
		for ug != nil || dg != nil {
			order := 0
			switch {
			case ug == nil:
				order = 1
			case dg == nil:
				order = -1
			default:
				order = uv.Cmp(dv)
			}
			if order < 0 || (order == 0 && ug.n > dg.n) {
				n := ug.n
				if order == 0 {
					n -= dg.n
				}
				upOnly = append(upOnly, hashGroup{ug.h, n})
			} else if order > 0 || (order == 0 && dg.n > ug.n) {
				n := dg.n
				if order == 0 {
					n -= ug.n
				}
				downOnly = append(downOnly, hashGroup{dg.h, n})
			}
			// Every differing group holds a row in memory below: past max_differences
			// groups the chunk is left undrilled (comparer.compare), which bounds that memory.
			if limit := c.maxDifferences; limit > 0 && int64(len(upOnly)+len(downOnly)) > limit {
				return errMaxDifferences
			}
			if order <= 0 {
				if ug, uv, err = readGroup(urows); err != nil {
					return fmt.Errorf("read upstream row hashes of %s: %w", t.name, err)
				}
			}
			if order >= 0 {
				if dg, dv, err = readGroup(drows); err != nil {
					return fmt.Errorf("read downstream row hashes of %s: %w", t.name, err)
				}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(upOnly) == 0 && len(downOnly) == 0 {
		return nil
	}
	type counted struct {
		row   []sqlValue
		canon string
		n     int64
	}
	// fetch reads one row of each group, keylessFetchBatch groups per query: each query
	// scans the range once (one query per group scanned it once per group, hundreds of
	// times for a table without an index, which is one chunk).
	fetch := func(side pairSide, groups []hashGroup) ([]*counted, error) {
		var out []*counted
		for len(groups) > 0 {
			batch := groups[:min(len(groups), keylessFetchBatch)]
			groups = groups[len(batch):]
			want := make(map[string]int64, len(batch))
			hs := make([]string, len(batch))
			for i, g := range batch {
				want[g.h] = g.n
				hs[i] = g.h
			}
			err := c.pair.withSide(ctx, side, func(ctx context.Context, q Querier) error {
				rows, err := q.QueryContext(ctx, p.rowsByHashesSQL(side, rng, hs))
				if err != nil {
					return err
				}
				defer rows.Close()
				w := p.width(side)
				s := newRowStream(rows, w+1)
				for {
					if err := s.next(); err != nil || s.done {
						return err
					}
					h := string(s.cur[w].Bytes)
					n, ok := want[h]
					if !ok {
						continue // a group already read (its other copies): no copy made
					}
					delete(want, h)
					row := s.row()[:w]
					out = append(out, &counted{row: row, canon: p.canonRow(row), n: n})
				}
			})
			if err != nil {
				return nil, fmt.Errorf("read %s rows of %s: %w", side, t.name, err)
			}
			// A group not found changed under us; a snapshot source cannot get here.
		}
		return out, nil
	}
	ups, err := fetch(upSide, upOnly)
	if err != nil {
		return err
	}
	downs, err := fetch(downSide, downOnly)
	if err != nil {
		return err
	}
	byCanon := map[string]*counted{}
	for _, d := range downs {
		if e, ok := byCanon[d.canon]; ok {
			e.n += d.n
			d.n = 0
			continue
		}
		byCanon[d.canon] = d
	}
	for _, u := range ups {
		if d, ok := byCanon[u.canon]; ok {
			m := min(u.n, d.n)
			u.n -= m
			d.n -= m
		}
	}
	report := func(kind DiffKind, c *counted) error {
		n := c.n
		if keep != nil && n > 0 {
			n = keep(kind, c.row, n)
		}
		switch {
		case n <= 0:
			return nil
		case kind == Missing:
			return emit(p.missing(c.row, int(n)))
		default:
			return emit(p.extra(c.row, int(n)))
		}
	}
	for _, u := range ups {
		if err := report(Missing, u); err != nil {
			return err
		}
	}
	for _, d := range downs {
		if err := report(Extra, d); err != nil {
			return err
		}
	}
	return nil
}

func (p *tablePlan) canonRow(row []sqlValue) string {
	var b strings.Builder
	for i, c := range p.Columns {
		s := canon(c.Kind, row[i])
		b.WriteString(strconv.Itoa(len(s)))
		b.WriteByte(':')
		b.WriteString(s)
	}
	return b.String()
}
