package e2e

// collation_workload_test.go is TestCollationKeys' workload: transactions on one TiDB
// session over a few keys spelt every way their collation holds equal (key swaps, unique
// keys contested, respellings), each turned into the events TiCDC would send, round by
// round, with the model of which rows exist.

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tidb-parity/parity/cdc/loadgen"
	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/cdc/upstream"
	"github.com/tidb-parity/parity/internal/ident"
)

// collWorkload runs the transactions on one TiDB session and turns each into TiCDC's
// events.
type collWorkload struct {
	t      *testing.T
	ctx    context.Context
	conn   *sql.Conn
	r      *rand.Rand
	pub    *collPublisher
	schema string

	seq    int64  // the value written to `v`, new for every statement
	lastTs uint64 // commit ts of the last transaction
	round  []*open.Event

	txns, events, roundsDone, respelled, collisions int
}

// rounds runs a few rounds of transactions on one table: each round 2-5 transactions,
// each a pattern picked at random among a few keys, then a resolved ts.
func (w *collWorkload) rounds(ct *collTable) {
	for range 2 {
		n := 2 + w.r.IntN(4)
		for range n {
			if ct.unique {
				w.uniqueTxn(ct)
			} else {
				w.keyTxn(ct)
			}
		}
		w.flush(ct)
	}
}

// flush publishes the round's events and the last commit ts as resolved ts.
func (w *collWorkload) flush(ct *collTable) {
	// A round in which one key is deleted under one spelling and inserted under another
	// is what the race needs.
	type seen struct{ del, ins map[string]bool }
	byFam := map[string]*seen{}
	for _, ev := range w.round {
		fk, spell := ct.familyKey(ev.Columns)
		var vals []string
		for _, c := range ev.Columns {
			vals = append(vals, c.Name+"="+strconv.Quote(loadgen.ColumnValueString(c)))
		}
		ct.history[fk] = append(ct.history[fk], fmt.Sprintf("round %d, commit ts %d: %s %s", w.roundsDone, ev.CommitTs, ev.Op, strings.Join(vals, " ")))
		if ev.Op == open.OpUpdate {
			continue
		}
		s := byFam[fk]
		if s == nil {
			s = &seen{map[string]bool{}, map[string]bool{}}
			byFam[fk] = s
		}
		if ev.Op == open.OpDelete {
			s.del[spell] = true
		} else {
			s.ins[spell] = true
		}
	}
	for _, s := range byFam {
		collide := false
		for d := range s.del {
			for i := range s.ins {
				if d != i {
					collide = true
				}
			}
		}
		if collide {
			w.collisions++
			break
		}
	}
	w.pub.send(collBatch{rows: w.round, resolved: w.lastTs})
	w.round = nil
	w.roundsDone++
}

// familyKey names the key a row holds up to its collation (the family of its string
// key part), and its exact spelling.
func (ct *collTable) familyKey(cols []open.Column) (fam, spelling string) {
	var f, s []string
	for _, c := range cols {
		if c.Flags&(open.FlagHandleKey|open.FlagUniqueKey) == 0 {
			continue
		}
		v := loadgen.ColumnValueString(c)
		if ct.unique && c.Name == "id" {
			continue // the unique value is the contested key
		}
		s = append(s, v)
		if c.Name == "k" || c.Name == "u" {
			for i, family := range ct.families {
				if slices.Contains(family, v) {
					v = "family" + strconv.Itoa(i)
				}
			}
		}
		f = append(f, v)
	}
	return strings.Join(f, ","), strings.Join(s, ",")
}

// exec runs one statement of the open transaction; it must change exactly one row
// (the workload's model of the table says which rows exist).
func (w *collWorkload) exec(q string, args ...any) {
	w.t.Helper()
	res, err := w.conn.ExecContext(w.ctx, q, args...)
	if err != nil {
		w.t.Fatalf("TiDB: %s %v: %v", q, args, err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		w.t.Fatalf("TiDB: %s %v changed %d rows (%v), want 1: the workload's model is wrong", q, args, n, err)
	}
}

// images reads every row of the table inside the open transaction, by storage key.
func (w *collWorkload) images(ct *collTable) map[string][]open.Column {
	w.t.Helper()
	rows, err := w.conn.QueryContext(w.ctx, "SELECT "+ct.identity+", "+ct.meta.SelectList()+" FROM "+ct.meta.QualifiedName())
	if err != nil {
		w.t.Fatalf("TiDB: read %s: %v", ct.name, err)
	}
	imgs, lead, err := upstream.ScanRows(rows, ct.meta, 1)
	if err != nil {
		w.t.Fatalf("TiDB: %v", err)
	}
	out := make(map[string][]open.Column, len(imgs))
	for i, img := range imgs {
		out[string(lead[i][0])] = img
	}
	return out
}

// txn runs body in one TiDB transaction and adds TiCDC's events of it to the round.
func (w *collWorkload) txn(ct *collTable, body func()) {
	w.t.Helper()
	if _, err := w.conn.ExecContext(w.ctx, "BEGIN PESSIMISTIC"); err != nil {
		w.t.Fatalf("TiDB: begin: %v", err)
	}
	before := w.images(ct)
	body()
	after := w.images(ct)
	if _, err := w.conn.ExecContext(w.ctx, "COMMIT"); err != nil {
		w.t.Fatalf("TiDB: commit: %v", err)
	}
	var info string
	if err := w.conn.QueryRowContext(w.ctx, "SELECT @@tidb_last_txn_info").Scan(&info); err != nil {
		w.t.Fatalf("TiDB: read @@tidb_last_txn_info: %v", err)
	}
	var ti struct {
		CommitTs uint64 `json:"commit_ts"`
	}
	if err := json.Unmarshal([]byte(info), &ti); err != nil || ti.CommitTs <= w.lastTs {
		w.t.Fatalf("TiDB: @@tidb_last_txn_info %q (%v): no commit after ts %d", info, err, w.lastTs)
	}
	w.lastTs = ti.CommitTs
	evs := w.changes(ct, before, after, ti.CommitTs)
	w.round = append(w.round, evs...)
	w.txns++
	w.events += len(evs)
}

// changes returns the events TiCDC emits for a transaction that turned the table from
// before into after: one change per storage key (the puller sees each key's last
// write), in TiCDC's sorter order (deletes, updates, inserts; by key), updates that
// change a primary- or unique-key value split into delete + insert, and then the
// deletes moved ahead of everything else (tiflow trySplitAndSortUpdateEvent).
func (w *collWorkload) changes(ct *collTable, before, after map[string][]open.Column, ts uint64) []*open.Event {
	ids := func(m map[string][]open.Column) []string {
		out := make([]string, 0, len(m))
		for id := range m {
			out = append(out, id)
		}
		slices.SortFunc(out, func(a, b string) int {
			x, errA := strconv.ParseInt(a, 10, 64)
			y, errB := strconv.ParseInt(b, 10, 64)
			if errA == nil && errB == nil {
				return cmp.Compare(x, y)
			}
			return strings.Compare(a, b)
		})
		return out
	}
	ev := func(id string, op open.Op, cols, old []open.Column) *open.Event {
		e := &open.Event{Kind: open.KindRow, CommitTs: ts, Schema: w.schema, Table: ct.name, Op: op, Columns: cols, OldColumns: old}
		if ct.rowid || ct.unique {
			e.RowID, _ = strconv.ParseInt(id, 10, 64)
		}
		return e
	}
	var dels, upds, ins []*open.Event
	for _, id := range ids(before) {
		if after[id] == nil {
			dels = append(dels, ev(id, open.OpDelete, before[id], nil))
		}
	}
	for _, id := range ids(after) {
		old := before[id]
		switch {
		case old == nil:
			ins = append(ins, ev(id, open.OpInsert, after[id], nil))
		case !collSameColumns(old, after[id]):
			upds = append(upds, ev(id, open.OpUpdate, after[id], old))
		}
	}
	var out []*open.Event
	for _, list := range [][]*open.Event{dels, upds, ins} {
		for _, e := range list {
			if e.Op != open.OpUpdate || !collKeyChanged(e) {
				out = append(out, e)
				continue
			}
			fOld, sOld := ct.familyKey(e.OldColumns)
			if fNew, sNew := ct.familyKey(e.Columns); fOld == fNew && sOld != sNew {
				w.respelled++ // one key, respelled
			}
			del := *e
			del.Op, del.Columns, del.OldColumns = open.OpDelete, e.OldColumns, nil
			insert := *e
			insert.Op, insert.OldColumns = open.OpInsert, nil
			out = append(out, &del, &insert)
		}
	}
	slices.SortStableFunc(out, func(a, b *open.Event) int {
		return cmp.Compare(collBoolInt(a.Op != open.OpDelete), collBoolInt(b.Op != open.OpDelete))
	})
	return out
}

func collBoolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// collKeyChanged is TiCDC's ShouldSplitUpdateEvent: a handle- or unique-key column's value
// string differs between the old and the new row.
func collKeyChanged(e *open.Event) bool {
	for i, c := range e.Columns {
		if c.Flags&(open.FlagHandleKey|open.FlagUniqueKey) != 0 &&
			loadgen.ColumnValueString(c) != loadgen.ColumnValueString(e.OldColumns[i]) {
			return true
		}
	}
	return false
}

func collSameColumns(a, b []open.Column) bool {
	return slices.EqualFunc(a, b, func(x, y open.Column) bool {
		return loadgen.ColumnValueString(x) == loadgen.ColumnValueString(y)
	})
}

// The key tables' statements. A slot's key is matched by its family's first spelling:
// TiDB compares it under the column's collation, so it finds the row however it is
// spelled now.

func (w *collWorkload) spell(ct *collTable, s collSlot) string {
	fam := ct.families[s.fam]
	return fam[w.r.IntN(len(fam))]
}

func (ct *collTable) where(s collSlot) (string, []any) {
	if s.fam < 0 {
		if ct.grouped {
			return "`g` = 0 AND `k` = ?", []any{collTmpKey}
		}
		return "`k` = ?", []any{collTmpKey}
	}
	if ct.grouped {
		return "`g` = ? AND `k` = ?", []any{s.g, ct.families[s.fam][0]}
	}
	return "`k` = ?", []any{ct.families[s.fam][0]}
}

func (w *collWorkload) keyValue(ct *collTable, s collSlot) (string, []any) {
	sp := collTmpKey
	if s.fam >= 0 {
		sp = w.spell(ct, s)
	}
	if ct.grouped {
		return "`g` = ?, `k` = ?", []any{max(s.g, 0), sp}
	}
	return "`k` = ?", []any{sp}
}

func (w *collWorkload) insert(ct *collTable, s collSlot) {
	set, args := w.keyValue(ct, s)
	w.seq++
	w.exec("INSERT INTO "+ident.Quote(ct.name)+" SET "+set+", `v` = ?, `note` = ?", append(args, w.seq, fmt.Sprintf("ins %v #%d", args, w.seq))...)
	ct.present[s] = true
}

func (w *collWorkload) update(ct *collTable, from, to collSlot) {
	set, args := w.keyValue(ct, to)
	wh, wargs := ct.where(from)
	w.seq++
	args = append(args, w.seq, fmt.Sprintf("upd %v #%d", args, w.seq))
	w.exec("UPDATE "+ident.Quote(ct.name)+" SET "+set+", `v` = ?, `note` = ? WHERE "+wh, append(args, wargs...)...)
	delete(ct.present, from)
	ct.present[to] = true
}

func (w *collWorkload) del(ct *collTable, s collSlot) {
	wh, args := ct.where(s)
	w.exec("DELETE FROM "+ident.Quote(ct.name)+" WHERE "+wh, args...)
	delete(ct.present, s)
}

func (w *collWorkload) ensure(ct *collTable, s collSlot) {
	if !ct.present[s] {
		w.insert(ct, s)
	}
}

func (w *collWorkload) pickSlot(ct *collTable) collSlot {
	s := collSlot{fam: w.r.IntN(len(ct.families))}
	if ct.grouped {
		s.g = 1 + w.r.IntN(2)
	}
	return s
}

// keyTxn runs one transaction of a random pattern on a table keyed by its string.
func (w *collWorkload) keyTxn(ct *collTable) {
	s := w.pickSlot(ct)
	switch x := w.r.IntN(10); {
	case x < 3: // respell (or insert a deleted key under a new spelling)
		w.txn(ct, func() {
			if ct.present[s] {
				w.update(ct, s, s)
			} else {
				w.insert(ct, s)
			}
		})
	case x < 5: // several respellings inside one transaction
		w.txn(ct, func() {
			w.ensure(ct, s)
			for range 2 + w.r.IntN(3) {
				w.update(ct, s, s)
			}
		})
	case x < 7: // delete and re-insert respelled inside one transaction
		w.txn(ct, func() {
			w.ensure(ct, s)
			w.del(ct, s)
			w.insert(ct, s)
		})
	case x < 8: // delete; a later transaction re-inserts it respelled
		w.txn(ct, func() {
			if ct.present[s] {
				w.del(ct, s)
			} else {
				w.insert(ct, s)
			}
		})
	default: // swap the keys of two rows through a temporary key, respelling both
		o := w.pickSlot(ct)
		for o == s {
			o = w.pickSlot(ct)
		}
		tmp := collSlot{g: -1, fam: -1}
		w.txn(ct, func() {
			w.ensure(ct, s)
			w.ensure(ct, o)
			w.update(ct, s, tmp)
			w.update(ct, o, s)
			w.update(ct, tmp, o)
		})
	}
}

// The unique table: rows `id`, each holding one family's value in `u` (or a value of
// its own), so moving a family's value from one row to another must free it first.

func (ct *collTable) freeValue(id int64) string { return "free" + strconv.FormatInt(id, 10) }

func (w *collWorkload) setU(ct *collTable, id int64, fam int) {
	u := ct.freeValue(id)
	switch {
	case fam >= 0:
		u = ct.families[fam][w.r.IntN(len(ct.families[fam]))]
	case fam == -2:
		u = collTmpKey
	}
	w.seq++
	w.exec("UPDATE `uk` SET `u` = ?, `v` = ? WHERE `id` = ?", u, w.seq, id)
	ct.holds[id] = fam
}

func (w *collWorkload) insertU(ct *collTable, fam int) int64 {
	ct.nextID++
	id := ct.nextID
	u := ct.freeValue(id)
	if fam >= 0 {
		u = ct.families[fam][w.r.IntN(len(ct.families[fam]))]
	}
	w.seq++
	w.exec("INSERT INTO `uk` (`id`, `u`, `v`) VALUES (?, ?, ?)", id, u, w.seq)
	ct.holds[id] = fam
	return id
}

func (w *collWorkload) deleteU(ct *collTable, id int64) {
	w.exec("DELETE FROM `uk` WHERE `id` = ?", id)
	delete(ct.holds, id)
}

// holder returns the row holding family fam, or 0.
func (ct *collTable) holder(fam int) int64 {
	for id, f := range ct.holds {
		if f == fam {
			return id
		}
	}
	return 0
}

// rowsU returns the ids in order (the model's map order is random; the workload's
// choices must not be).
func (ct *collTable) rowsU() []int64 {
	var ids []int64
	for id := range ct.holds {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// uniqueTxn runs one transaction of a random pattern on the unique table.
func (w *collWorkload) uniqueTxn(ct *collTable) {
	fam := w.r.IntN(len(ct.families))
	w.txn(ct, func() {
		// Every family is held by some row, and there are spare rows to move them to.
		for f := range ct.families {
			if ct.holder(f) == 0 {
				w.insertU(ct, f)
			}
		}
		for len(ct.holds) < len(ct.families)+2 {
			w.insertU(ct, -1)
		}
		a := ct.holder(fam)
		ids := ct.rowsU()
		b := ids[w.r.IntN(len(ids))]
		for b == a {
			b = ids[w.r.IntN(len(ids))]
		}
		switch x := w.r.IntN(5); x {
		case 0: // respell the unique value
			for range 1 + w.r.IntN(3) {
				w.setU(ct, a, fam)
			}
		case 1: // move it to another row: the delete frees it
			bf := ct.holds[b]
			w.deleteU(ct, a)
			w.setU(ct, b, fam)
			if bf >= 0 {
				w.insertU(ct, bf) // b's old value lives on in a new row
			}
		case 2: // move it to another row: an update frees it
			bf := ct.holds[b]
			w.setU(ct, a, -1)
			w.setU(ct, b, fam)
			if bf >= 0 {
				w.setU(ct, a, bf)
			}
		case 3: // swap the values of two rows through a temporary value
			bf := ct.holds[b]
			w.setU(ct, a, -2)
			w.setU(ct, b, fam)
			w.setU(ct, a, bf)
		default: // delete the row and insert it again under a new id, respelled
			w.deleteU(ct, a)
			w.insertU(ct, fam)
		}
	})
}
