package loadgen

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/cdc/upstream"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/retry"
	"github.com/tidb-parity/parity/internal/tso"
)

// The big-transaction mode: instead of the workload, ONE upstream transaction inserts N
// rows into sbtest1, and the changefeed carries all N row events with that transaction's
// commit ts, followed by a resolved ts after it. It demonstrates that the applier's
// memory is bounded by applier.memory-bytes: a transaction larger than the bound must
// spill to disk (issue 4: "show it with a single 1,000,000-row upstream transaction").

const (
	// bigInsertRows is the rows per multi-row INSERT inside the big transaction.
	bigInsertRows = 1000
	// bigReadRows is the rows read back, encoded and written to Kafka per step, which
	// bounds the generator's own memory whatever the transaction size.
	bigReadRows = 10_000
)

// BigTxnResult describes a RunBigTransaction run.
type BigTxnResult struct {
	Result
	// CommitTs is the big transaction's commit ts (every published row carries it).
	CommitTs uint64
	// Table is the table the rows went into; FirstID..LastID are their ids.
	Table           string
	FirstID, LastID int64
}

// ValidateBigTransaction reports every problem with cfg for RunBigTransaction, each with
// its key: Validate's, plus the settings the big-transaction mode needs or ignores.
func (c *Config) ValidateBigTransaction(rows int) error {
	var errs []error
	if err := c.Validate(); err != nil {
		errs = append(errs, err)
	}
	if rows <= 0 {
		errs = append(errs, fmt.Errorf("big-transaction-rows: must be positive, got %d", rows))
	}
	if c.Tables < 1 {
		errs = append(errs, fmt.Errorf("tables: big-transaction-rows inserts into sbtest1, so tables must be at least 1, got %d", c.Tables))
	}
	if c.Transactions != 0 || c.Duration != 0 || c.Rate != 0 {
		errs = append(errs, errors.New("transactions/duration/rate: not used with big-transaction-rows (it runs exactly one transaction); leave them 0"))
	}
	return errors.Join(errs...)
}

// RunBigTransaction sets up the tables as Run does (reset, tables, CREATE DDL events or
// the import, a resolved ts at the start), then runs one transaction on TiDB inserting
// rows rows into sbtest1 with multi-row INSERTs between BEGIN and COMMIT, takes its
// commit ts from @@tidb_last_txn_info, and publishes all of its rows with that commit ts
// (read back from TiDB at the commit ts, dispatched and batched like every other
// transaction), then a resolved ts covering it, by the same sequencer rule as the workload.
//
// The transaction is not retried: if TiDB rolls it back (a conflict, or a transaction
// size limit) the run fails with TiDB's error and publishes no rows of it.
func RunBigTransaction(ctx context.Context, cfg Config, rows int) (BigTxnResult, error) {
	if err := cfg.ValidateBigTransaction(rows); err != nil {
		return BigTxnResult{}, fmt.Errorf("loadgen config: %w", err)
	}
	g := &Generator{cfg: cfg, log: cfg.Logger}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	var out BigTxnResult
	res, err := g.setUp(ctx)
	defer g.closeSetUp()
	if err == nil {
		out, err = g.bigTransaction(ctx, res, rows)
	}
	out.StartTs = res.StartTs
	out.ImportTs = res.ImportTs
	out.ResolvedTs = g.resolved.Load()
	out.Transactions = g.committed.Load()
	out.Rows = g.rows.Load()
	out.Records = g.records.Load()
	return out, err
}

// bigTransaction runs and publishes the one big transaction.
func (g *Generator) bigTransaction(ctx context.Context, res Result, rows int) (BigTxnResult, error) {
	out := BigTxnResult{Result: res}
	t := g.tables[0] // sbtest1: specs lists the sysbench tables first
	tname := t.meta.QualifiedName()
	out.Table = t.meta.Schema + "." + t.meta.Name
	idName := ident.Quote(t.meta.Columns[t.idCol].Name)
	var maxID int64
	if err := g.up.QueryRowContext(ctx, "SELECT IFNULL(MAX("+idName+"), 0) FROM "+tname).Scan(&maxID); err != nil {
		return out, fmt.Errorf("read max id of %s: %w", tname, err)
	}
	out.FirstID, out.LastID = maxID+1, maxID+int64(rows)
	t.nextID.Store(out.FirstID)
	g.seq = newSequencer(res.StartTs)

	conn, err := g.up.Conn(ctx)
	if err != nil {
		return out, fmt.Errorf("upstream connection: %w", err)
	}
	defer conn.Close()
	// Optimistic: nothing else writes these fresh ids, and a pessimistic transaction
	// would lock every inserted key one statement at a time for nothing.
	if _, err := conn.ExecContext(ctx, "BEGIN OPTIMISTIC"); err != nil {
		return out, fmt.Errorf("begin: %w", err)
	}
	seed := g.cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	r := rand.New(rand.NewPCG(seed, 0xb16))
	start := time.Now()
	lastLog := start
	for done := 0; done < rows; {
		k := min(bigInsertRows, rows-done)
		vals := make([][]any, k)
		for i := range vals {
			id := t.nextID.Add(1) - 1
			vals[i] = []any{id, sbK(r, int64(rows)), SysbenchC(r), SysbenchPad(r)}
		}
		ictx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		err := g.insertRows(ictx, conn, t, vals)
		cancel()
		if err != nil {
			g.rollback(conn)
			return out, fmt.Errorf("big transaction, after %d of %d rows: %w", done, rows, err)
		}
		done += k
		if time.Since(lastLog) >= g.cfg.ProgressInterval {
			g.log.Info("big transaction: inserting", "table", tname, "rows", done, "of", rows)
			lastLog = time.Now()
		}
	}
	inserted := time.Since(start)

	// As in runTxn: register with the sequencer right before COMMIT, and from here on the
	// outcome must be known (bounded, cancellation ignored).
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Minute)
	defer cancel()
	token, lb := g.seq.begin()
	commitStart := time.Now()
	if _, err := conn.ExecContext(cctx, "COMMIT"); err != nil {
		var me *mysql.MySQLError
		if retry.Classify(err) == retry.Conflict || errors.As(err, &me) && me.Number == 8004 { // 8004: transaction too large
			g.seq.abort(token) // TiDB rolled it back
			return out, fmt.Errorf("big transaction of %d rows into %s rolled back: COMMIT: %w", rows, tname, err)
		}
		// The token stays registered: no resolved ts can pass this transaction.
		return out, fmt.Errorf("%w: big transaction COMMIT: %v", errUnknownCommit, err)
	}
	commitTs, err := lastCommitTs(cctx, conn, lb)
	if err != nil {
		return out, err
	}
	out.CommitTs = commitTs
	g.seq.committed(token, &txn{commitTs: commitTs}) // its events are streamed below
	g.committed.Add(1)
	g.log.Info("big transaction committed", "table", tname, "rows", rows, "commit_ts", commitTs,
		"insert", inserted.Round(time.Millisecond), "commit", time.Since(commitStart).Round(time.Millisecond))

	// Publish: the sequencer's bound B covers the transaction once a fresh TSO is taken;
	// its rows go to Kafka (acknowledged), and only then B as the resolved ts.
	pctx, pcancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Minute)
	defer pcancel()
	n, err := currentTSO(pctx, conn)
	if err != nil {
		return out, err
	}
	txns, bound := g.seq.take(n)
	if len(txns) != 1 || txns[0].commitTs != commitTs {
		return out, fmt.Errorf("publish: sequencer released %d transactions at bound %d, want the big transaction at %d", len(txns), bound, commitTs)
	}
	pubStart := time.Now()
	if err := g.publishBig(pctx, t, commitTs, out.FirstID, out.LastID); err != nil {
		return out, err
	}
	recs, err := g.prod.resolved(pctx, bound)
	if err != nil {
		return out, err
	}
	g.records.Add(int64(recs))
	g.resolved.Store(bound)
	g.log.Info("big transaction published", "rows", g.rows.Load(), "records", g.records.Load(), "resolved_ts", bound,
		"publish", time.Since(pubStart).Round(time.Millisecond))
	return out, nil
}

// publishBig reads the transaction's rows back from TiDB as of its commit ts, in id
// order and bigReadRows at a time, and publishes them as insert events at that commit
// ts, each step acknowledged by Kafka before the next. Every id must be there: a missing
// row fails the run instead of shipping an incomplete transaction.
func (g *Generator) publishBig(ctx context.Context, t *genTable, commitTs uint64, first, last int64) error {
	tname := t.meta.QualifiedName()
	conn, err := g.up.Conn(ctx)
	if err != nil {
		return fmt.Errorf("upstream connection: %w", err)
	}
	defer conn.Close()
	release, err := tso.At(ctx, conn, commitTs)
	if err != nil {
		return fmt.Errorf("read back %s: %w", tname, err)
	}
	defer release()
	idName := ident.Quote(t.meta.Columns[t.idCol].Name)
	q := "SELECT " + t.meta.SelectList() + " FROM " + tname + " WHERE " + idName + " BETWEEN ? AND ? ORDER BY " + idName
	lastLog := time.Now()
	for lo := first; lo <= last; lo += bigReadRows {
		hi := min(lo+bigReadRows-1, last)
		qctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		rows, err := conn.QueryContext(qctx, q, lo, hi)
		if err != nil {
			cancel()
			return fmt.Errorf("read back %s ids %d..%d at ts %d: %w", tname, lo, hi, commitTs, err)
		}
		images, _, err := upstream.ScanRows(rows, t.meta, 0)
		cancel()
		if err != nil {
			return err
		}
		if int64(len(images)) != hi-lo+1 {
			return fmt.Errorf("read back %s ids %d..%d at commit ts %d: %d rows, want %d", tname, lo, hi, commitTs, len(images), hi-lo+1)
		}
		events := make([]*open.Event, len(images))
		for i, img := range images {
			events[i] = rowEvent(t, open.OpInsert, img, nil)
			events[i].CommitTs = commitTs
		}
		recs, n, err := g.prod.publishTxns(ctx, []*txn{{commitTs: commitTs, events: events}})
		if err != nil {
			return err
		}
		g.records.Add(int64(recs))
		g.rows.Add(int64(n))
		if time.Since(lastLog) >= g.cfg.ProgressInterval {
			g.log.Info("big transaction: publishing", "table", tname, "rows", g.rows.Load(), "of", last-first+1)
			lastLog = time.Now()
		}
	}
	return nil
}
