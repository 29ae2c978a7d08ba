package loadgen

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/cdc/upstream"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/retry"
	"github.com/tidb-parity/parity/internal/tso"
)

// genTable is a table the workload changes.
type genTable struct {
	spec   tableSpec
	meta   *upstream.Table
	idCol  int          // position of `id`, or -1 for the keyless table
	nextID atomic.Int64 // next id to insert
}

// limiter spaces transactions evenly at a fixed rate over all workers.
type limiter struct {
	mu       sync.Mutex
	next     time.Time
	interval time.Duration
}

func (l *limiter) wait(ctx context.Context) error {
	if l == nil {
		return ctx.Err()
	}
	l.mu.Lock()
	now := time.Now()
	if l.next.Before(now) {
		l.next = now
	}
	at := l.next
	l.next = l.next.Add(l.interval)
	l.mu.Unlock()
	if d := time.Until(at); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return ctx.Err()
}

// errUnknownCommit marks a transaction whose COMMIT outcome or commit ts is unknown: the
// changefeed can no longer be complete, so the run stops.
var errUnknownCommit = errors.New("commit outcome unknown")

// runTxn runs one transaction on conn and hands it to the sequencer. It returns false
// when the transaction changed nothing (it is then rolled back and not counted).
func (g *Generator) runTxn(ctx context.Context, conn *sql.Conn, r *rand.Rand) (bool, error) {
	tables := g.pickTables(r)
	if _, err := conn.ExecContext(ctx, "BEGIN PESSIMISTIC"); err != nil {
		return false, fmt.Errorf("begin: %w", err)
	}
	var events []*open.Event
	for _, t := range tables {
		var evs []*open.Event
		var err error
		if t.idCol < 0 {
			evs, err = g.changeKeyless(ctx, conn, r, t)
		} else {
			evs, err = g.changeKeyed(ctx, conn, r, t)
		}
		if err != nil {
			g.rollback(conn)
			return false, err
		}
		events = append(events, evs...)
	}
	if len(events) == 0 {
		g.rollback(conn)
		return false, nil
	}
	// A stopping run commits nothing more. This check also keeps the COMMIT off a dead
	// connection: when ctx ends just as a statement above finishes, go-sql-driver's
	// watcher may close the connection after that statement succeeded, and the COMMIT
	// would then fail unsent with "bad connection" — an unknown outcome that ends the
	// run without its final resolved ts. ctx still live here means the watcher did not.
	if err := ctx.Err(); err != nil {
		g.rollback(conn)
		return false, err
	}
	// From here on the outcome must be known: COMMIT and reading its ts ignore
	// cancellation (bounded), so a stopping run never loses a committed transaction.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	token, lb := g.seq.begin()
	if _, err := conn.ExecContext(cctx, "COMMIT"); err != nil {
		if retry.Classify(err) == retry.Conflict {
			g.seq.abort(token) // TiDB rolled it back
			return false, err
		}
		// The token stays registered: the resolved ts can never pass this transaction.
		return false, fmt.Errorf("%w: COMMIT: %v", errUnknownCommit, err)
	}
	commitTs, err := lastCommitTs(cctx, conn, lb)
	if err != nil {
		return false, err
	}
	for _, ev := range events {
		ev.CommitTs = commitTs
	}
	g.seq.committed(token, &txn{commitTs: commitTs, events: events})
	if g.cfg.CheckImages {
		// A check cut short by the run's end proves nothing either way.
		if err := g.checkImages(ctx, commitTs, events); err != nil && ctx.Err() == nil {
			return true, err
		}
	}
	return true, nil
}

// errImage marks a published image that differs from TiDB's row at the commit ts
// (Config.CheckImages).
var errImage = errors.New("published image differs from TiDB")

// checkImages reads the rows events changed at TiDB snapshot commitTs and compares them
// with the events' images (the last event of each key decides: its image, or no row
// after a delete). Keyless tables are not checked.
func (g *Generator) checkImages(ctx context.Context, commitTs uint64, events []*open.Event) error {
	last := map[*genTable]map[int64][]open.Column{} // nil image: deleted
	for _, ev := range events {
		i := slices.IndexFunc(g.tables, func(gt *genTable) bool {
			return gt.meta.Schema == ev.Schema && gt.meta.Name == ev.Table && gt.idCol >= 0
		})
		if i < 0 {
			continue
		}
		t := g.tables[i]
		if last[t] == nil {
			last[t] = map[int64][]open.Column{}
		}
		id := asInt64(ev.Columns[t.idCol].Value)
		if ev.Op == open.OpDelete {
			last[t][id] = nil
		} else {
			last[t][id] = ev.Columns
		}
	}
	conn, err := g.up.Conn(ctx)
	if err != nil {
		return fmt.Errorf("check images: %w", err)
	}
	defer conn.Close()
	release, err := tso.At(ctx, conn, commitTs)
	if err != nil {
		return fmt.Errorf("check images: %w", err)
	}
	defer release()
	for t, byID := range last {
		name := t.meta.Schema + "." + t.meta.Name
		ids := slices.Collect(maps.Keys(byID))
		slices.Sort(ids)
		got, err := g.readByID(ctx, conn, t, ids, false)
		if err != nil {
			return fmt.Errorf("check images: %w", err)
		}
		for _, id := range ids {
			w, have := byID[id], got[id]
			switch {
			case w == nil && have != nil:
				return fmt.Errorf("%w: %s id %d at commit ts %d: deleted in the changefeed, present in TiDB", errImage, name, id, commitTs)
			case w != nil && have == nil:
				return fmt.Errorf("%w: %s id %d at commit ts %d: present in the changefeed, absent in TiDB", errImage, name, id, commitTs)
			case w != nil:
				for i := range w {
					if !reflect.DeepEqual(w[i].Value, have[i].Value) {
						return fmt.Errorf("%w: %s id %d at commit ts %d: column %s differs", errImage, name, id, commitTs, w[i].Name)
					}
				}
			}
		}
	}
	return nil
}

// lastCommitTs returns the commit ts of the transaction the session has just committed,
// from @@tidb_last_txn_info; it must lie above lb, the sequencer's bound taken before
// the COMMIT. Any failure is errUnknownCommit: the transaction may have committed.
func lastCommitTs(ctx context.Context, conn *sql.Conn, lb uint64) (uint64, error) {
	var info string
	if err := conn.QueryRowContext(ctx, "SELECT @@tidb_last_txn_info").Scan(&info); err != nil {
		return 0, fmt.Errorf("%w: read @@tidb_last_txn_info: %v", errUnknownCommit, err)
	}
	var ti struct {
		CommitTs uint64 `json:"commit_ts"`
		Error    string `json:"error"`
	}
	if err := json.Unmarshal([]byte(info), &ti); err != nil {
		return 0, fmt.Errorf("%w: parse @@tidb_last_txn_info %q: %v", errUnknownCommit, info, err)
	}
	if ti.Error != "" || ti.CommitTs <= lb {
		return 0, fmt.Errorf("%w: @@tidb_last_txn_info %q does not describe a commit after ts %d", errUnknownCommit, info, lb)
	}
	return ti.CommitTs, nil
}

// rollback rolls the open transaction back. If that fails the session is unusable: the
// next BEGIN would implicitly commit the half-done transaction, which the changefeed
// would never carry; so the connection is marked bad and dropped.
func (g *Generator) rollback(conn *sql.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	}
}

// pickTables returns one table, or 2–3 distinct ones with probability MultiTable, in a
// fixed order so concurrent transactions lock tables in the same order.
func (g *Generator) pickTables(r *rand.Rand) []*genTable {
	n := 1
	if len(g.tables) > 1 && r.Float64() < g.cfg.MultiTable {
		n = 2 + r.IntN(2)
		n = min(n, len(g.tables))
	}
	idx := r.Perm(len(g.tables))[:n]
	slices.Sort(idx)
	out := make([]*genTable, n)
	for i, j := range idx {
		out[i] = g.tables[j]
	}
	return out
}

type opKind int

const (
	opInsert opKind = iota
	opUpdate
	opDelete
)

func (g *Generator) pickOp(r *rand.Rand) opKind {
	total := g.cfg.InsertWeight + g.cfg.UpdateWeight + g.cfg.DeleteWeight
	x := r.IntN(total)
	switch {
	case x < g.cfg.InsertWeight:
		return opInsert
	case x < g.cfg.InsertWeight+g.cfg.UpdateWeight:
		return opUpdate
	}
	return opDelete
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?,", n), ",")
}

func asInt64(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case uint64:
		return int64(x)
	}
	return 0
}

// rowEvent builds a row event of table t.
func rowEvent(t *genTable, op open.Op, cols, old []open.Column) *open.Event {
	ev := &open.Event{Kind: open.KindRow, Schema: t.meta.Schema, Table: t.meta.Name, Op: op, Columns: cols, OldColumns: old}
	if t.meta.IntHandle {
		ev.RowID = asInt64(cols[t.meta.Handle[0]].Value)
	}
	return ev
}

// readByID reads the current images of the given ids of table t (inside the open
// transaction), optionally locking them.
func (g *Generator) readByID(ctx context.Context, conn *sql.Conn, t *genTable, ids []int64, lock bool) (map[int64][]open.Column, error) {
	out := map[int64][]open.Column{}
	if len(ids) == 0 {
		return out, nil
	}
	q := "SELECT " + t.meta.SelectList() + " FROM " + t.meta.QualifiedName() + " WHERE " +
		ident.Quote(t.meta.Columns[t.idCol].Name) + " IN (" + placeholders(len(ids)) + ") ORDER BY 1"
	if lock {
		q += " FOR UPDATE"
	}
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	rows, err := conn.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", t.meta.QualifiedName(), err)
	}
	images, _, err := upstream.ScanRows(rows, t.meta, 0)
	if err != nil {
		return nil, err
	}
	for _, img := range images {
		out[asInt64(img[t.idCol].Value)] = img
	}
	return out, nil
}

// newRowValues returns the values of every column of a new row with the given id.
func (g *Generator) newRowValues(r *rand.Rand, t *genTable, id int64) []any {
	switch t.spec.kind {
	case kindSysbench:
		return []any{id, sbK(r, t.nextID.Load()), SysbenchC(r), SysbenchPad(r)}
	case kindAllTypes:
		return append([]any{id}, allTypesValues(r)...)
	}
	return keylessValues(r)
}

func (g *Generator) insertRows(ctx context.Context, conn execer, t *genTable, rows [][]any) error {
	if len(rows) == 0 {
		return nil
	}
	var b strings.Builder
	b.WriteString("INSERT INTO " + t.meta.QualifiedName() + " (")
	for i, c := range t.meta.Columns {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(ident.Quote(c.Name))
	}
	b.WriteString(") VALUES ")
	ph := "(" + placeholders(len(t.meta.Columns)) + ")"
	var args []any
	for i, row := range rows {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(ph)
		args = append(args, row...)
	}
	if _, err := conn.ExecContext(ctx, b.String(), args...); err != nil {
		return fmt.Errorf("insert into %s: %w", t.meta.QualifiedName(), err)
	}
	return nil
}

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// changeKeyed runs inserts, updates (some changing the primary key) and deletes on a
// table with an integer primary key `id` and returns the row events TiCDC would emit:
// deletes, then updates, then inserts (TiCDC's order inside a transaction).
func (g *Generator) changeKeyed(ctx context.Context, conn *sql.Conn, r *rand.Rand, t *genTable) ([]*open.Event, error) {
	n := 1 + r.IntN(g.cfg.RowsPerTxn)
	var inserts, updates, deletes int
	for i := 0; i < n; i++ {
		switch g.pickOp(r) {
		case opInsert:
			inserts++
		case opUpdate:
			updates++
		default:
			deletes++
		}
	}
	// Existing rows to update or delete, locked in id order.
	var cands []int64
	if next := t.nextID.Load(); next > 1 && updates+deletes > 0 {
		seen := map[int64]bool{}
		for len(cands) < updates+deletes && len(seen) < int(next-1) {
			id := 1 + r.Int64N(next-1)
			if !seen[id] {
				seen[id] = true
				cands = append(cands, id)
			}
		}
		slices.Sort(cands)
	}
	old, err := g.readByID(ctx, conn, t, cands, true)
	if err != nil {
		return nil, err
	}
	var found []int64
	for _, id := range cands {
		if old[id] != nil {
			found = append(found, id)
		}
	}
	r.Shuffle(len(found), func(i, j int) { found[i], found[j] = found[j], found[i] })
	nu := min(updates, len(found))
	updIDs, delIDs := found[:nu], found[nu:]
	if len(delIDs) > deletes {
		delIDs = delIDs[:deletes]
	}
	idName := ident.Quote(t.meta.Columns[t.idCol].Name)
	tname := t.meta.QualifiedName()

	var events []*open.Event
	if len(delIDs) > 0 {
		args := make([]any, len(delIDs))
		for i, id := range delIDs {
			args[i] = id
		}
		if _, err := conn.ExecContext(ctx, "DELETE FROM "+tname+" WHERE "+idName+" IN ("+placeholders(len(delIDs))+")", args...); err != nil {
			return nil, fmt.Errorf("delete from %s: %w", tname, err)
		}
		for _, id := range delIDs {
			events = append(events, rowEvent(t, open.OpDelete, old[id], nil))
		}
	}

	type move struct{ from, to int64 }
	var moves []move
	var changed []int64 // ids whose new image must be read
	for _, id := range updIDs {
		if r.Float64() < g.cfg.PKUpdate {
			to := t.nextID.Add(1) - 1
			if _, err := conn.ExecContext(ctx, "UPDATE "+tname+" SET "+idName+" = ? WHERE "+idName+" = ?", to, id); err != nil {
				return nil, fmt.Errorf("update primary key of %s: %w", tname, err)
			}
			moves = append(moves, move{id, to})
			changed = append(changed, to)
			continue
		}
		if err := g.updateRow(ctx, conn, r, t, id); err != nil {
			return nil, err
		}
		changed = append(changed, id)
	}

	var newRows [][]any
	for i := 0; i < inserts; i++ {
		id := t.nextID.Add(1) - 1
		newRows = append(newRows, g.newRowValues(r, t, id))
		changed = append(changed, id)
	}
	if err := g.insertRows(ctx, conn, t, newRows); err != nil {
		return nil, err
	}

	// A locking read is a current read: a plain SELECT in a pessimistic transaction reads
	// the snapshot at its start ts plus its own writes, so a row committed by another
	// transaction after that start ts and updated here without a change in value (TiDB
	// writes nothing then) would be invisible to it.
	cur, err := g.readByID(ctx, conn, t, changed, true)
	if err != nil {
		return nil, err
	}
	image := func(id int64) ([]open.Column, error) {
		if img := cur[id]; img != nil {
			return img, nil
		}
		// Not seen by the batched read: read it alone (a point get), and name what this
		// transaction did to it if that fails too.
		one, err := g.readByID(ctx, conn, t, []int64{id}, true)
		if err != nil {
			return nil, err
		}
		if img := one[id]; img != nil {
			g.log.Warn("row missed by a batched read of the transaction's own writes; read alone", "table", tname, "id", id)
			cur[id] = img
			return img, nil
		}
		what := "inserted"
		if slices.Contains(updIDs, id) {
			what = "updated"
		}
		if slices.ContainsFunc(moves, func(m move) bool { return m.to == id }) {
			what = "the new key of a primary-key update"
		}
		return nil, fmt.Errorf("read back %s id %d (%s in this transaction): row not found inside its own transaction", tname, id, what)
	}
	var updEvents, insEvents []*open.Event
	for _, id := range updIDs {
		if slices.ContainsFunc(moves, func(m move) bool { return m.from == id }) {
			continue
		}
		img, err := image(id)
		if err != nil {
			return nil, err
		}
		if sameImage(img, old[id]) {
			continue // TiDB writes nothing for an update that changes no value
		}
		updEvents = append(updEvents, rowEvent(t, open.OpUpdate, img, old[id]))
	}
	for _, m := range moves {
		img, err := image(m.to)
		if err != nil {
			return nil, err
		}
		if g.cfg.RawPKUpdates {
			updEvents = append(updEvents, rowEvent(t, open.OpUpdate, img, old[m.from]))
		} else {
			// TiCDC splits a handle-changing update into a delete and an insert.
			events = append(events, rowEvent(t, open.OpDelete, old[m.from], nil))
			insEvents = append(insEvents, rowEvent(t, open.OpInsert, img, nil))
		}
	}
	for _, row := range newRows {
		img, err := image(asInt64(row[t.idCol]))
		if err != nil {
			return nil, err
		}
		insEvents = append(insEvents, rowEvent(t, open.OpInsert, img, nil))
	}
	events = append(events, updEvents...)
	return append(events, insEvents...), nil
}

// updateRow changes some non-key columns of one row.
func (g *Generator) updateRow(ctx context.Context, conn *sql.Conn, r *rand.Rand, t *genTable, id int64) error {
	tname := t.meta.QualifiedName()
	idName := ident.Quote(t.meta.Columns[t.idCol].Name)
	var q string
	var args []any
	switch t.spec.kind {
	case kindSysbench:
		if r.IntN(2) == 0 {
			q = "UPDATE " + tname + " SET `k` = `k` + 1 WHERE " + idName + " = ?"
			args = []any{id}
		} else {
			q = "UPDATE " + tname + " SET `c` = ? WHERE " + idName + " = ?"
			args = []any{SysbenchC(r), id}
		}
	default:
		vals := g.newRowValues(r, t, id)
		var sets []string
		for _, i := range r.Perm(len(t.meta.Columns))[:1+r.IntN(4)] {
			if i == t.idCol {
				continue
			}
			sets = append(sets, ident.Quote(t.meta.Columns[i].Name)+" = ?")
			args = append(args, vals[i])
		}
		if len(sets) == 0 {
			return nil
		}
		q = "UPDATE " + tname + " SET " + strings.Join(sets, ", ") + " WHERE " + idName + " = ?"
		args = append(args, id)
	}
	if _, err := conn.ExecContext(ctx, q, args...); err != nil {
		return fmt.Errorf("update %s: %w", tname, err)
	}
	return nil
}

func sameImage(a, b []open.Column) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !reflect.DeepEqual(a[i].Value, b[i].Value) {
			return false
		}
	}
	return true
}

// changeKeyless inserts (often duplicate) rows into the keyless table and updates or
// deletes single rows picked by TiDB's hidden _tidb_rowid.
func (g *Generator) changeKeyless(ctx context.Context, conn *sql.Conn, r *rand.Rand, t *genTable) ([]*open.Event, error) {
	tname := t.meta.QualifiedName()
	n := 1 + r.IntN(g.cfg.RowsPerTxn)
	var ops []opKind
	for i := 0; i < n; i++ {
		ops = append(ops, g.pickOp(r))
	}
	var maxRow int64
	if slices.ContainsFunc(ops, func(o opKind) bool { return o != opInsert }) {
		if err := conn.QueryRowContext(ctx, "SELECT IFNULL(MAX(_tidb_rowid), 0) FROM "+tname).Scan(&maxRow); err != nil {
			return nil, fmt.Errorf("read max _tidb_rowid of %s: %w", tname, err)
		}
	}
	image := func(vals []any) []open.Column {
		img := make([]open.Column, len(t.meta.Columns))
		for i, c := range t.meta.Columns {
			img[i] = open.Column{Name: c.Name, Type: c.Type, Flags: c.Flags, Value: vals[i]}
		}
		return img
	}
	var dels, upds, ins []*open.Event
	touched := map[int64]bool{}
	var starts []int64
	for _, op := range ops {
		if op != opInsert && maxRow > 0 {
			starts = append(starts, r.Int64N(maxRow+1))
		}
	}
	slices.Sort(starts)
	si := 0
	var lastSeen []any
	// Updates and deletes first, so they only pick rows that existed before this
	// transaction (a row inserted and deleted in one transaction yields no event).
	for _, op := range ops {
		if op == opInsert {
			continue
		}
		if si >= len(starts) {
			continue
		}
		start := starts[si]
		si++
		rows, err := conn.QueryContext(ctx, "SELECT _tidb_rowid, "+t.meta.SelectList()+" FROM "+tname+
			" WHERE _tidb_rowid >= ? ORDER BY _tidb_rowid LIMIT 1 FOR UPDATE", start)
		if err != nil {
			return nil, fmt.Errorf("pick a row of %s: %w", tname, err)
		}
		images, lead, err := upstream.ScanRows(rows, t.meta, 1)
		if err != nil {
			return nil, err
		}
		if len(images) == 0 {
			continue
		}
		var rowid int64
		fmt.Sscan(string(lead[0][0]), &rowid)
		if touched[rowid] {
			continue
		}
		touched[rowid] = true
		oldImg := images[0]
		lastSeen = make([]any, len(oldImg))
		for i, c := range oldImg {
			lastSeen[i] = c.Value
		}
		if op == opDelete {
			if _, err := conn.ExecContext(ctx, "DELETE FROM "+tname+" WHERE _tidb_rowid = ?", rowid); err != nil {
				return nil, fmt.Errorf("delete from %s: %w", tname, err)
			}
			dels = append(dels, rowEvent(t, open.OpDelete, oldImg, nil))
			continue
		}
		vals := keylessValues(r)
		if _, err := conn.ExecContext(ctx, "UPDATE "+tname+" SET `a` = ?, `b` = ? WHERE _tidb_rowid = ?", vals[0], vals[1], rowid); err != nil {
			return nil, fmt.Errorf("update %s: %w", tname, err)
		}
		newImg := image(vals)
		if sameImage(newImg, oldImg) {
			continue
		}
		upds = append(upds, rowEvent(t, open.OpUpdate, newImg, oldImg))
	}
	var newRows [][]any
	for _, op := range ops {
		if op != opInsert {
			continue
		}
		vals := keylessValues(r)
		if lastSeen != nil && r.IntN(3) == 0 {
			vals = slices.Clone(lastSeen) // an exact duplicate of an existing row
		}
		newRows = append(newRows, vals)
		ins = append(ins, rowEvent(t, open.OpInsert, image(vals), nil))
	}
	if err := g.insertRows(ctx, conn, t, newRows); err != nil {
		return nil, err
	}
	out := append(dels, upds...)
	return append(out, ins...), nil
}
