package cdc

// repair.go repairs rows of the fallback through the apply stream: inside Barrier(T) at
// the applied checkpoint T, with the coordinator paused (nothing the applier writes can
// race it), each key's row is read from TiDB at T and written to the fallback with the
// applier's own statement builders on its own sessions (the changefeed's time_zone,
// foreign_key_checks=0): REPLACE of the upstream row, or a delete by key when TiDB has
// no row for it at T. The keys come from the caller (cmd/parity reads them from a
// checker run's stored differences; cdc does not import checker). What was done is
// recorded in the meta schema's repairs table (the "repair" component).

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/cdc/upstream"
	"github.com/tidb-parity/parity/internal/barrier"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/metaschema"
	"github.com/tidb-parity/parity/internal/tso"
)

// RepairsTable records every key a repair wrote or examined.
const RepairsTable = "repairs"

// repairMigrations are the "repair" component's steps: append-only, "%s" is the quoted
// meta schema.
var repairMigrations = []metaschema.Step{
	{Name: "repairs: keys repaired through the apply stream", Stmts: []string{
		`CREATE TABLE IF NOT EXISTS %s.` + RepairsTable + ` (
			changefeed VARCHAR(128) NOT NULL,
			repair_id VARCHAR(64) NOT NULL,
			seq INT NOT NULL,
			run_id VARCHAR(64) NOT NULL,
			schema_name VARCHAR(64) NOT NULL,
			table_name VARCHAR(64) NOT NULL,
			row_key TEXT NOT NULL,
			action VARCHAR(16) NOT NULL,
			repair_ts BIGINT UNSIGNED NOT NULL,
			reason TEXT NULL,
			repaired_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
			PRIMARY KEY (changefeed, repair_id, seq),
			KEY run (run_id)
		) ENGINE=InnoDB`,
	}},
}

func init() {
	metaschema.Register(metaschema.Component{Name: "repair", Tables: []string{RepairsTable}, Steps: repairMigrations})
}

// RepairKey is one row to repair, named by its key.
type RepairKey struct {
	// Schema and Table are the upstream table's names.
	Schema string `json:"schema"`
	Table  string `json:"table"`
	// DownSchema and DownTable are the fallback table the difference was found in; a
	// key whose table is not where the changefeed writes the upstream table is refused.
	// Empty: where the changefeed writes it.
	DownSchema string `json:"down_schema,omitempty"`
	DownTable  string `json:"down_table,omitempty"`
	// Columns and Values are the key: the table's handle-key columns (its primary key,
	// or the NOT NULL unique key TiCDC uses) and their values as internal/rowkey types
	// them (int64, uint64, float64, string, []byte), as the checker reads them: ENUM and
	// SET as their text, TIMESTAMP as UTC text (Repair reads it in the changefeed's
	// time zone).
	Columns []string `json:"-"`
	Values  []any    `json:"-"`
	// Text is the key's text form, recorded in the meta schema and returned; it is never
	// logged (row values never go into logs).
	Text string `json:"key"`
}

// RepairAction is what a repair did to a key.
type RepairAction string

// Repair actions.
const (
	// RepairUpsert: the fallback's row was replaced by the upstream row at T.
	RepairUpsert RepairAction = "upsert"
	// RepairDelete: TiDB had no row with the key at T; the fallback's was deleted.
	RepairDelete RepairAction = "delete"
	// RepairUnchanged: the fallback already held exactly the upstream row at T (or, with
	// no row upstream, none): nothing was written.
	RepairUnchanged RepairAction = "unchanged"
	// RepairRefused: the key cannot be repaired by key (a table without a primary or
	// NOT NULL unique key, a key that is not the table's handle, a table the changefeed
	// writes elsewhere, a table TiDB does not have at T); Reason says which.
	RepairRefused RepairAction = "refused"
)

// RepairRequest asks Repair for keys.
type RepairRequest struct {
	// ID names the repair in the meta schema; empty: a new one ("r" + time + random).
	ID string
	// RunID is the run whose differences the keys are, recorded with them.
	RunID string
	Keys  []RepairKey
	// DryRun examines every key inside the barrier as a repair would and reports what
	// it would do, writing nothing (nor recording anything).
	DryRun bool
}

// RepairOutcome is what happened to one key.
type RepairOutcome struct {
	Key    RepairKey    `json:"key"`
	Action RepairAction `json:"action"`
	// TS is the TSO the key was repaired at: TiDB was read at it, and the fallback was
	// held exactly at it while the key was written.
	TS     uint64 `json:"repair_ts"`
	Reason string `json:"reason,omitempty"`
}

// RepairResult is what Repair did.
type RepairResult struct {
	ID        string          `json:"repair_id"`
	RunID     string          `json:"run_id"`
	DryRun    bool            `json:"dry_run"`
	Outcomes  []RepairOutcome `json:"keys"`
	Upserted  int             `json:"upserted"`
	Deleted   int             `json:"deleted"`
	Unchanged int             `json:"unchanged"`
	Refused   int             `json:"refused"`
	// Barriers is how many times the applier was held (one per batch of keys), and
	// MaxPause the longest hold.
	Barriers int           `json:"barriers"`
	MaxPause time.Duration `json:"max_pause_ns"`
	// Passed counts barrier TSOs the applier had already applied beyond (tried again at
	// the newer applied ts).
	Passed int `json:"barrier_passed"`
}

func (res *RepairResult) add(o RepairOutcome) {
	res.Outcomes = append(res.Outcomes, o)
	switch o.Action {
	case RepairUpsert:
		res.Upserted++
	case RepairDelete:
		res.Deleted++
	case RepairUnchanged:
		res.Unchanged++
	case RepairRefused:
		res.Refused++
	}
}

// repairBatchKeys bounds the keys repaired inside one barrier, and so the pause.
const repairBatchKeys = 32

// repairPassedRetries bounds how often a batch's barrier may find the applier already
// beyond the applied ts it read.
const repairPassedRetries = 100

// Repair repairs the fallback's rows of req.Keys through the apply stream (see the file
// comment): in batches of at most 32 keys, each inside Barrier(T) at the applier's
// applied checkpoint T (taken again when the applier passed it first). It needs
// upstream.dsn and a running replicator (ErrStopped otherwise). A key that cannot be
// repaired by key is refused, with a reason, and the others go on; an error (a lost
// connection, ctx ending) stops the repair, and what was done before it is returned
// and recorded.
func (r *Replicator) Repair(ctx context.Context, req RepairRequest) (RepairResult, error) {
	res := RepairResult{ID: req.ID, RunID: req.RunID, DryRun: req.DryRun, Outcomes: []RepairOutcome{}}
	if res.ID == "" {
		res.ID = newRepairID()
	}
	if r.cfg.Upstream.DSN == "" {
		return res, errors.New("repair reads the upstream rows from TiDB: set upstream.dsn")
	}
	log := r.log.With("repair_id", res.ID, "run_id", req.RunID)
	seq := 0
	for start := 0; start < len(req.Keys); start += repairBatchKeys {
		batch := req.Keys[start:min(start+repairBatchKeys, len(req.Keys))]
		outs, pause, passed, err := r.repairBatch(ctx, batch, req.DryRun)
		res.Passed += passed
		if len(outs) > 0 {
			res.Barriers++
			res.MaxPause = max(res.MaxPause, pause)
		}
		for _, o := range outs {
			res.add(o)
		}
		if !req.DryRun && len(outs) > 0 {
			// Recorded even when the batch failed part-way or ctx ended: those keys
			// were written.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			rerr := r.recordRepairs(rctx, res.ID, req.RunID, seq, outs)
			cancel()
			if rerr != nil && err == nil {
				err = rerr
			}
		}
		seq += len(outs)
		if len(outs) > 0 {
			logBatch(log, outs, pause, req.DryRun)
		}
		if err != nil {
			return res, fmt.Errorf("repair %s: %w", res.ID, err)
		}
	}
	log.Info("repair finished", "dry_run", req.DryRun, "keys", len(req.Keys), "upserted", res.Upserted, "deleted", res.Deleted,
		"unchanged", res.Unchanged, "refused", res.Refused, "barriers", res.Barriers, "max_pause", res.MaxPause)
	return res, nil
}

func logBatch(log interface{ Info(string, ...any) }, outs []RepairOutcome, pause time.Duration, dry bool) {
	var up, del, same, refused int
	tables := map[string]bool{}
	for _, o := range outs {
		tables[o.Key.Schema+"."+o.Key.Table] = true
		switch o.Action {
		case RepairUpsert:
			up++
		case RepairDelete:
			del++
		case RepairUnchanged:
			same++
		case RepairRefused:
			refused++
		}
	}
	names := make([]string, 0, len(tables))
	for t := range tables {
		names = append(names, t)
	}
	log.Info("repair batch", "dry_run", dry, "resolved_ts", outs[0].TS, "table", strings.Join(names, ","), "keys", len(outs),
		"upserted", up, "deleted", del, "unchanged", same, "refused", refused, "pause", pause)
}

// repairBatch repairs keys inside one barrier at the applied checkpoint, taken again
// while the applier passes it first. It returns the outcomes of the keys it finished
// (all of them unless err), how long the applier was held, and how many barriers the
// applier had passed.
func (r *Replicator) repairBatch(ctx context.Context, keys []RepairKey, dry bool) (outs []RepairOutcome, pause time.Duration, passed int, err error) {
	for {
		r.mu.Lock()
		ts := r.applied
		r.mu.Unlock()
		// fn runs on the coordinator's goroutine and may still be running when Barrier
		// returns (ctx ended): Hold waits for it, and fn never starts after that.
		var (
			bouts []RepairOutcome
			held  time.Time
		)
		ran, berr := barrier.Hold(ctx, r.Barrier, ts, func(bctx context.Context) error {
			held = time.Now()
			var ferr error
			bouts, ferr = r.repairAt(bctx, ts, keys, dry)
			pause = time.Since(held)
			return ferr
		})
		if ran {
			return bouts, pause, passed, berr
		}
		if errors.Is(berr, ErrBarrierPassed) && passed < repairPassedRetries {
			passed++
			continue
		}
		return nil, 0, passed, berr
	}
}

// repairAt repairs keys while the fallback is held exactly at ts (inside the barrier).
func (r *Replicator) repairAt(ctx context.Context, ts uint64, keys []RepairKey, dry bool) ([]RepairOutcome, error) {
	a, rows := r.apply.Load(), r.rows
	if a == nil || rows == nil {
		return nil, ErrStopped
	}
	conn, err := rows.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("connecting to the upstream: %w", err)
	}
	defer conn.Close()
	release, err := tso.At(ctx, conn, ts)
	if err != nil {
		return nil, err
	}
	defer release()
	tables := map[[2]string]*upstream.Table{}
	missing := map[[2]string]error{}
	var outs []RepairOutcome
	for _, k := range keys {
		o := RepairOutcome{Key: k, TS: ts}
		tk := [2]string{k.Schema, k.Table}
		t, ok := tables[tk]
		if !ok && missing[tk] == nil {
			qctx, cancel := context.WithTimeout(ctx, a.cfg.Applier.QueryTimeout)
			t, err = upstream.LoadTable(qctx, conn, k.Schema, k.Table)
			cancel()
			if err != nil {
				if !strings.Contains(err.Error(), "does not exist") {
					return outs, tso.Hint(err)
				}
				missing[tk] = err
			} else {
				tables[tk] = t
			}
		}
		if err := missing[tk]; err != nil {
			o.Action, o.Reason = RepairRefused, fmt.Sprintf("TiDB has no table %s.%s at ts %d", k.Schema, k.Table, ts)
			outs = append(outs, o)
			continue
		}
		act, reason, err := r.repairKey(ctx, a, conn, t, k, dry)
		if err != nil {
			return outs, fmt.Errorf("table %s.%s: %w", k.Schema, k.Table, err)
		}
		o.Action, o.Reason = act, reason
		outs = append(outs, o)
	}
	return outs, nil
}

// repairKey repairs one key of upstream table t (read at the barrier's ts through up).
func (r *Replicator) repairKey(ctx context.Context, a *applier, up *sql.Conn, t *upstream.Table, k RepairKey, dry bool) (RepairAction, string, error) {
	name := k.Schema + "." + k.Table
	if len(t.Handle) == 0 {
		return RepairRefused, fmt.Sprintf("table %s has no primary key or NOT NULL unique key: parity repairs rows by key only; "+
			"apply the run's fix SQL for it by hand, or re-import the table", name), nil
	}
	downSchema, downTable := a.cfg.targetSchema(k.Schema), k.Table
	if k.DownSchema != "" && (k.DownSchema != downSchema || k.DownTable != downTable) {
		return RepairRefused, fmt.Sprintf("the run compared %s with %s.%s, but the changefeed writes it to %s.%s", name, k.DownSchema, k.DownTable, downSchema, downTable), nil
	}
	// The key must be the handle TiCDC keys the table by: then it names one row on both
	// sides, as the applier's own writes do.
	if len(k.Columns) != len(t.Handle) || len(k.Values) != len(k.Columns) {
		return RepairRefused, handleMismatch(t, k), nil
	}
	key := make([]open.Column, len(k.Columns))
	for i, name := range k.Columns {
		p := t.Col(name)
		if p < 0 || t.Columns[p].Flags&open.FlagHandleKey == 0 || k.Values[i] == nil {
			return RepairRefused, handleMismatch(t, k), nil
		}
		c := t.Columns[p]
		key[i] = open.Column{Name: c.Name, Type: c.Type, Flags: c.Flags, Value: k.Values[i]}
		if c.Type == open.TypeTimestamp {
			v, ok, err := a.fromUTC(ctx, k.Values[i])
			if err != nil {
				return "", "", err
			}
			if !ok {
				return RepairRefused, fmt.Sprintf("key column %s of %s: a TIMESTAMP the changefeed's time zone cannot express", c.Name, name), nil
			}
			key[i].Value = v
		}
	}
	var img []open.Column
	err := a.retry(ctx, ident.Table(t.Schema, t.Name)+" (upstream)", func(ctx context.Context) (err error) {
		img, err = upstream.FetchRow(ctx, up, t, key)
		if errors.Is(err, upstream.ErrRowNotFound) {
			img, err = nil, nil
		}
		return tso.Hint(err)
	})
	if err != nil {
		return "", "", err
	}
	target := ident.Table(downSchema, downTable)
	if img == nil {
		// No row upstream at ts: the fallback must have none either. Only a row whose
		// key is exactly this one is deleted: where the fallback's collation holds two
		// spellings equal and TiDB's does not ('ABC' reported extra, 'abc' missing),
		// the row an earlier key of the repair wrote ('abc') is not this key's.
		var n int64
		err := a.retry(ctx, target, func(ctx context.Context) error {
			q, args := selectByKey("COALESCE(SUM("+sameRowExpr(key)+"), 0)", downSchema, downTable, key, sameRowArgs(key))
			return a.db.QueryRowContext(ctx, q, args...).Scan(&n)
		})
		if err != nil || n == 0 {
			return RepairUnchanged, "", err
		}
		if !dry {
			q, args := buildDeleteByHandle(downSchema, downTable, [][]open.Column{key})
			if err := a.retry(ctx, target, func(ctx context.Context) error {
				return a.meta.execMarked(ctx, a.db, "repair", []txnStmt{{table: target, q: q, args: args}}, nil)
			}); err != nil {
				return "", "", err
			}
		}
		return RepairDelete, "", nil
	}
	cols := writable(img)
	var n, same int64
	err = a.retry(ctx, target, func(ctx context.Context) error {
		q, args := selectByKey("COUNT(*), COALESCE(SUM("+sameRowExpr(cols)+"), 0)", downSchema, downTable, key, sameRowArgs(cols))
		return a.db.QueryRowContext(ctx, q, args...).Scan(&n, &same)
	})
	if err != nil {
		return "", "", err
	}
	if n == 1 && same == 1 {
		return RepairUnchanged, "", nil
	}
	if !dry {
		// REPLACE, as TiCDC's safe mode: it also evicts a row holding another unique
		// key's value, and rewrites a key column a collation held equal ('ABC' for 'abc').
		q, args := buildUpsert(downSchema, downTable, [][]open.Column{cols}, modeReplace)
		if err := a.retry(ctx, target, func(ctx context.Context) error {
			return a.meta.execMarked(ctx, a.db, "repair", []txnStmt{{table: target, q: q, args: args}}, nil)
		}); err != nil {
			return "", "", err
		}
	}
	return RepairUpsert, "", nil
}

// fromUTC returns a TIMESTAMP key value given as UTC text (as the checker reads it) in
// the apply sessions' time zone (the changefeed's), which the upstream reads and the
// fallback's writes use. ok is false when the zone has no such time.
func (a *applier) fromUTC(ctx context.Context, v any) (any, bool, error) {
	s, isText := v.(string)
	tz, _ := sessionTimeZone(a.cfg.Changefeed.TimeZone)
	if !isText || tz == "+00:00" {
		return v, true, nil
	}
	var out sql.NullString
	err := a.retry(ctx, "TIMESTAMP key", func(ctx context.Context) error {
		return a.db.QueryRowContext(ctx, "SELECT CAST(CONVERT_TZ(?, '+00:00', @@session.time_zone) AS CHAR)", s).Scan(&out)
	})
	return out.String, out.Valid, err
}

func handleMismatch(t *upstream.Table, k RepairKey) string {
	want := make([]string, len(t.Handle))
	for i, p := range t.Handle {
		want[i] = t.Columns[p].Name
	}
	return fmt.Sprintf("the run's key (%s) of %s.%s is not the table's handle key in TiDB (%s), by which the changefeed writes its rows",
		strings.Join(k.Columns, ", "), k.Schema, k.Table, strings.Join(want, ", "))
}

// selectByKey is SELECT what FROM the table WHERE <key columns = values>, with extra
// arguments for what first.
func selectByKey(what, schema, table string, key []open.Column, whatArgs []any) (string, []any) {
	var b strings.Builder
	args := append([]any(nil), whatArgs...)
	b.WriteString("SELECT " + what + " FROM " + ident.Table(schema, table) + " WHERE ")
	for i, c := range key {
		if i > 0 {
			b.WriteString(" AND ")
		}
		b.WriteString(ident.Quote(c.Name))
		if c.Type == open.TypeFloat {
			b.WriteString(" = CAST(? AS FLOAT)") // a FLOAT holds a float32
		} else {
			b.WriteString(" = ?")
		}
		args = append(args, c.Value)
	}
	return b.String(), args
}

// sameRowExpr is a condition true for a row that holds exactly the values of cols, as
// the write would leave it: text by its bytes (a collation's equal is not enough:
// 'abc' is not 'ABC'), numbers, temporal values and binary strings by value, a FLOAT at
// its precision. It may be false for a row that is the same (a text column whose
// character set is not utf8mb4), which only writes the same row again; it is never true
// for a row the write would change. Its arguments are sameRowArgs(cols).
func sameRowExpr(cols []open.Column) string {
	var b strings.Builder
	for i, c := range cols {
		if i > 0 {
			b.WriteString(" AND ")
		}
		q := ident.Quote(c.Name)
		switch c.Value.(type) {
		case nil:
			b.WriteString(q + " IS NULL")
		case string:
			if textType(c.Type) {
				b.WriteString("CAST(" + q + " AS BINARY) = CAST(? AS BINARY)")
			} else {
				b.WriteString(q + " = ?")
			}
		case float64:
			if c.Type == open.TypeFloat {
				b.WriteString(q + " = CAST(? AS FLOAT)")
			} else {
				b.WriteString(q + " = ?")
			}
		default:
			b.WriteString(q + " = ?")
		}
	}
	return b.String()
}

func sameRowArgs(cols []open.Column) []any {
	args := make([]any, 0, len(cols))
	for _, c := range cols {
		if c.Value != nil {
			args = append(args, c.Value)
		}
	}
	return args
}

// textType reports the open-protocol types whose string values are text compared by a
// collation (character and JSON columns), as opposed to DECIMAL and temporal values.
func textType(t byte) bool {
	switch t {
	case open.TypeVarchar, open.TypeVarString, open.TypeString, open.TypeTinyBlob, open.TypeBlob,
		open.TypeMediumBlob, open.TypeLongBlob, open.TypeJSON, open.TypeEnum, open.TypeSet:
		return true
	}
	return false
}

// recordRepairs records outcomes as rows seq, seq+1, ... of repair id.
func (r *Replicator) recordRepairs(ctx context.Context, id, runID string, seq int, outs []RepairOutcome) error {
	m := r.meta.Load()
	if m == nil {
		return ErrStopped
	}
	var b strings.Builder
	b.WriteString(m.q("INSERT INTO %s." + RepairsTable + " (changefeed, repair_id, seq, run_id, schema_name, table_name, row_key, action, repair_ts, reason) VALUES "))
	args := make([]any, 0, 10*len(outs))
	for i, o := range outs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("(?,?,?,?,?,?,?,?,?,?)")
		var reason any
		if o.Reason != "" {
			reason = o.Reason
		}
		args = append(args, m.changefeed, id, seq+i, runID, o.Key.Schema, o.Key.Table, o.Key.Text, string(o.Action), o.TS, reason)
	}
	if err := m.exec(ctx, b.String(), args...); err != nil {
		return fmt.Errorf("recording the repair in %s.%s: %w", m.raw, RepairsTable, err)
	}
	return nil
}

func newRepairID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "r" + time.Now().UTC().Format("20060102T150405") + "-" + hex.EncodeToString(b[:])
}

// Config returns the replicator's configuration (for the daemon's parts that read the
// same servers and meta schema, such as the repair endpoint).
func (r *Replicator) Config() Config { return r.cfg }
