package cdc

// apply_write.go is the apply workers' side: a worker turns the ops it is sent into
// multi-row statements (batch, at most maxStatementBytes, one under construction per
// table), and a table without a handle is written with its progress row in one
// transaction (applyKeyless).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"unsafe"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/ident"
)

// batch is a multi-row statement being assembled.
type batch struct {
	schema, table string
	del           bool
	mode          writeMode
	info          *tableInfo // the downstream table of upserts (nil: none)
	load          bool       // written by LOAD DATA (load.go)
	rows          [][]open.Column
	bytes         int
}

const maxStatementBytes = 4 << 20

// maxTxnBytes bounds the values one worker's transaction writes.
const maxTxnBytes = 32 << 20

// workerNames are the apply workers' writers in the marker table (bypasslog): one row
// per worker, so concurrent workers never wait for each other's marker.
var workerNames = func() []string {
	n := make([]string, 256)
	for i := range n {
		n[i] = fmt.Sprintf("apply-%d", i)
	}
	return n
}()

// stmtTexts are an apply worker's statement buffers. A statement's text is written into
// one and executed as a string over its bytes; the buffer is written again only after
// the transaction holding the statement committed. Nothing keeps the text past its Exec
// (the driver copies it into its packet buffer, and errors name the table, not the
// statement), so the worker's statements reuse a few arrays instead of allocating one
// each (about 200 bytes a row).
type stmtTexts struct {
	free [][]byte
}

// maxKeptText bounds the array of a statement kept for reuse.
const maxKeptText = 1 << 20

// get returns an empty buffer, reused when one is free.
func (t *stmtTexts) get() []byte {
	if n := len(t.free); n > 0 {
		b := t.free[n-1]
		t.free = t.free[:n-1]
		return b[:0]
	}
	return nil
}

// put gives b back once no statement uses its bytes.
func (t *stmtTexts) put(b []byte) {
	if cap(b) > 0 && cap(b) <= maxKeptText && len(t.free) < 64 {
		t.free = append(t.free, b)
	}
}

// str is the statement text in b, as a string over b's bytes: b must not be written
// until the statement has run (put after its transaction committed).
func (t *stmtTexts) str(b []byte) string {
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// stmt is a transaction's statement of table whose text q is in one of t's buffers.
func (t *stmtTexts) stmt(schema, table string, q []byte, args []any) txnStmt {
	return txnStmt{table: ident.Table(schema, table), q: t.str(q), args: args, text: q}
}

// upsert is the multi-row upsert of rows (appendUpsert) in one of t's buffers.
func (t *stmtTexts) upsert(schema, table string, rows [][]open.Column, mode writeMode) txnStmt {
	q, args := appendUpsert(t.get(), schema, table, rows, mode)
	return t.stmt(schema, table, q, args)
}

func (a *applier) worker(ctx context.Context, ch <-chan []op, writer string, texts *stmtTexts) error {
	// One statement under construction per table: ops of tables produced concurrently
	// interleave on the channel without cutting each other's statements short. Within a
	// table, a change of kind (delete/upsert, columns) flushes first, so the versions of
	// a row are written in order. Finished statements join the worker's transaction,
	// which commits at applier.txn-rows rows (or maxTxnBytes), at a fence, before a
	// keyless unit and at the round's end. Its statements run back to back at that point,
	// not one by one as they are made: a transaction open while the worker waits for rows
	// holds its row locks meanwhile, another worker can wait for them while the producer
	// feeding both waits for that worker's channel, and InnoDB cannot see that cycle (it
	// ends at innodb_lock_wait_timeout). Tried in 50ace4b, reverted after a CI run stalled.
	batches := map[[2]string]*batch{}
	var order [][2]string
	var (
		txn               []txnStmt
		txnRows, txnBytes int
		between           = func() error { return a.hooks.fire(hookBetweenStatements) }
	)
	commit := func() error {
		if len(txn) == 0 {
			return nil
		}
		what := txn[0].table
		if len(txn) > 1 {
			what = fmt.Sprintf("%s and %d more statement(s)", what, len(txn)-1)
		}
		err := a.retry(ctx, what, func(ctx context.Context) error {
			err := a.meta.execMarked(ctx, a.db, writer, txn, between)
			var lw *errLoadWarnings
			if errors.As(err, &lw) {
				// Rolled back: the same rows again, as INSERT statements (load.go).
				a.log.Warn("LOAD DATA left warnings; the table's rows are written with INSERT from now on", "table", lw.table, "warnings", lw.warnings)
				a.ctr.loadFallbacks.Add(1)
				txn = asInserts(txn, texts)
				err = a.meta.execMarked(ctx, a.db, writer, txn, between)
			}
			return err
		})
		if err != nil {
			return err
		}
		a.rows.Add(int64(txnRows))
		for i := range txn {
			if txn[i].load != nil {
				a.ctr.loads.Add(1)
			}
			texts.put(txn[i].text)
		}
		clear(txn)
		txn, txnRows, txnBytes = txn[:0], 0, 0
		return nil
	}
	flush := func(b *batch) error {
		if len(b.rows) == 0 {
			return nil
		}
		switch {
		case b.del:
			q, args := appendDeleteByHandle(texts.get(), b.schema, b.table, b.rows)
			txn = append(txn, texts.stmt(b.schema, b.table, q, args))
		case b.load:
			// The rows stay referenced until the commit, to be written with INSERT
			// should the load leave warnings.
			txn = append(txn, newLoadStmt(b.schema, b.table, b.mode, b.info, slices.Clone(b.rows), appendLoadData(texts.get(), b.rows)))
		default:
			txn = append(txn, texts.upsert(b.schema, b.table, b.rows, b.mode))
		}
		txnRows, txnBytes = txnRows+len(b.rows), txnBytes+b.bytes
		clear(b.rows)
		b.rows = b.rows[:0]
		b.bytes = 0
		if txnRows >= a.cfg.Applier.TxnRows || txnBytes >= maxTxnBytes {
			return commit()
		}
		return nil
	}
	flushAll := func() error {
		for _, k := range order {
			if err := flush(batches[k]); err != nil {
				return err
			}
		}
		return commit()
	}
	var last *batch // the batch of the previous op: consecutive ops are mostly of one table
	add := func(o *op) error {
		if o.fence != nil {
			if err := flushAll(); err != nil {
				return err
			}
			o.fence <- struct{}{} // buffered for every worker of the lane
			return nil
		}
		if o.unit != nil {
			if err := flushAll(); err != nil {
				return err
			}
			return a.applyKeyless(ctx, o.unit, writer)
		}
		b := last
		if b == nil || b.table != o.table || b.schema != o.schema {
			k := [2]string{o.schema, o.table}
			b = batches[k]
			if b == nil {
				b = &batch{schema: o.schema, table: o.table, rows: make([][]open.Column, 0, a.cfg.Applier.BatchRows)}
				batches[k] = b
				order = append(order, k)
			}
			last = b
		}
		maxRows := a.cfg.Applier.BatchRows
		if b.load {
			maxRows = a.cfg.Applier.LoadRows
		}
		if len(b.rows) > 0 && (b.del != o.del || b.mode != o.mode || b.info != o.info ||
			!sameNames(b.rows[0], o.cols) || len(b.rows) >= maxRows || b.bytes >= maxStatementBytes ||
			b.load && !loadValues(o.cols)) { // a row LOAD DATA cannot write starts an INSERT
			if err := flush(b); err != nil {
				return err
			}
		}
		if len(b.rows) == 0 {
			b.del, b.mode, b.info = o.del, o.mode, o.info
			b.load = a.load && !o.del && loadColumns(o.info, o.mode, o.cols) && loadValues(o.cols)
		}
		b.rows = append(b.rows, o.cols)
		b.bytes += rowBytes(o.cols)
		return nil
	}
	for chunk := range ch {
		for i := range chunk {
			if err := add(&chunk[i]); err != nil {
				return err
			}
		}
		a.spareChunk(chunk) // add kept the ops' rows, not the ops
	}
	if err := flushAll(); err != nil {
		return err
	}
	return ctx.Err()
}

// applyKeyless applies a table without a handle: inserts append, deletes remove exactly
// one equal row, updates do both; all in one transaction with the table's progress.
func (a *applier) applyKeyless(ctx context.Context, u *keylessUnit, writer string) error {
	k := u.tb.key
	if u.target <= a.progressOf(k) {
		// Applied before a restart, beyond the checkpoint: the restart's first rounds
		// may stop at resolved ts below the table's progress. Nothing to do, and the
		// progress must not move back (rows above target would be applied again).
		return nil
	}
	schema, table := a.cfg.targetSchema(k.Schema), k.Table
	var n int64
	var byOp [3]int64
	var done uint64
	err := a.retry(ctx, ident.Table(schema, table), func(ctx context.Context) error {
		n, byOp = 0, [3]int64{}
		tx, err := a.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() //nolint:errcheck // no-op after commit
		if err := a.meta.fence(ctx, tx); err != nil {
			return err
		}
		// The durable progress, read under the row lock: an earlier attempt whose
		// COMMIT failed on the wire may have committed (or be committing) after all.
		done, err = a.meta.tableProgress(ctx, tx, k)
		if err != nil {
			return fmt.Errorf("reading table progress: %w", err)
		}
		done = max(done, a.progressOf(k))
		if u.target <= done {
			return nil
		}
		if err := a.meta.mark(ctx, tx, writer); err != nil {
			return err
		}
		var ins [][]open.Column
		insBytes := 0
		flush := func() error {
			if len(ins) == 0 {
				return nil
			}
			q, args := buildUpsert(schema, table, ins, modeInsert)
			ins, insBytes = ins[:0], 0
			_, err := tx.ExecContext(ctx, q, args...)
			return err
		}
		for ev, err := range u.tb.events(u.target) {
			if err != nil {
				return err
			}
			if ev.CommitTs <= done {
				continue // applied before a crash, together with its progress row
			}
			n++
			if i := int(ev.Op) - 1; i >= 0 && i < len(byOp) {
				byOp[i]++
			}
			cols := writable(ev.Columns)
			if ev.Op == open.OpDelete || ev.Op == open.OpUpdate {
				old := cols
				if ev.Op == open.OpUpdate {
					if ev.OldColumns == nil {
						return fmt.Errorf("table %s has no primary or unique key and an update at commit ts %d carries no old row (enable TiCDC output-old-value)", k, ev.CommitTs)
					}
					old = writable(oldRow(ev))
				}
				if err := flush(); err != nil {
					return err
				}
				q, args := buildDeleteOne(schema, table, old)
				if _, err := tx.ExecContext(ctx, q, args...); err != nil {
					return err
				}
				if ev.Op == open.OpDelete {
					continue
				}
			}
			if len(ins) > 0 && (!sameNames(ins[0], cols) || len(ins) >= a.cfg.Applier.BatchRows || insBytes >= maxStatementBytes) {
				if err := flush(); err != nil {
					return err
				}
			}
			ins = append(ins, cols)
			insBytes += rowBytes(cols)
		}
		if err := flush(); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, a.meta.tableProgressSQL(), a.meta.changefeed, k.Schema, k.Table, u.target); err != nil {
			return fmt.Errorf("recording table progress: %w", err)
		}
		if err := a.hooks.fire(hookBeforeKeylessCommit); err != nil {
			return err
		}
		return tx.Commit()
	})
	if err != nil {
		return err
	}
	a.rows.Add(n)
	for i, k := range byOp {
		a.round[i].Add(k)
	}
	a.mu.Lock()
	a.tableProgress[k] = max(a.tableProgress[k], u.target, done)
	a.mu.Unlock()
	return nil
}
