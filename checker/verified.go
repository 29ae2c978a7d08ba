package checker

// verified.go owns the record of clean verifications (diff_verified): per changefeed and
// upstream table, the newest TSO at which a run at a snapshot pair found the table equal.
// Scope cdc starts there (dirty.go), and the daemon's freshness is measured from it. It
// must not decide whether a table is equal (the report does) nor read the ledger.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/internal/ident"
)

// verifiedTable is the record's table in the meta schema (see steps in state.go).
const verifiedTable = "diff_verified"

// Verification is a table's last clean verification for a changefeed: every change of
// the changefeed to it with a commit ts at or below Ts has been compared and found equal
// (at Ts or at a later snapshot pair).
type Verification struct {
	Changefeed string
	// Schema and Table are the upstream's names (as the ledger keeps them).
	Schema, Table string
	// Ts is the TSO the table was verified at.
	Ts uint64
	// RunID is the checker run that verified it, Scope that run's scope.
	RunID, Scope string
	// At is when it was recorded.
	At time.Time
}

// RecordVerification records v unless a newer verification of the table is recorded
// (the stored Ts never moves back). A run records its clean tables itself (see
// runner.recordVerified); this is for callers that verify a table otherwise. db holds
// the meta schema metaSchema, migrated (by any checker run, or metaschema.Migrate).
func RecordVerification(ctx context.Context, db *sql.DB, metaSchema string, v Verification) error {
	return recordVerification(ctx, db, metaSchema, v, 0)
}

// recordVerification records v; with after > 0 only over a recorded verification at or
// above after (a since: scope verifies a table only when it starts no later than the
// table's last clean verification).
func recordVerification(ctx context.Context, x execer, metaSchema string, v Verification, after uint64) error {
	_, err := recordVerificationN(ctx, x, metaSchema, v, after)
	return err
}

// recordVerificationN is recordVerification, reporting whether a row changed.
func recordVerificationN(ctx context.Context, x execer, metaSchema string, v Verification, after uint64) (bool, error) {
	if v.Changefeed == "" || v.Ts == 0 {
		return false, errors.New("record verification: changefeed and ts are required")
	}
	if v.At.IsZero() {
		v.At = time.Now()
	}
	tbl := ident.Table(metaSchema, verifiedTable)
	var res sql.Result
	var err error
	if after > 0 {
		res, err = x.ExecContext(ctx, "UPDATE "+tbl+" SET verified_ts = ?, run_id = ?, scope = ?, verified_at = ?"+
			" WHERE changefeed = ? AND schema_name = ? AND table_name = ? AND verified_ts >= ? AND verified_ts < ?",
			v.Ts, v.RunID, truncateRunes(v.Scope, 128), v.At.UTC(), v.Changefeed, v.Schema, v.Table, after, v.Ts)
	} else {
		res, err = x.ExecContext(ctx, "INSERT INTO "+tbl+" (changefeed, schema_name, table_name, verified_ts, run_id, scope, verified_at) VALUES (?, ?, ?, ?, ?, ?, ?)"+
			" ON DUPLICATE KEY UPDATE run_id = IF(VALUES(verified_ts) > verified_ts, VALUES(run_id), run_id),"+
			" scope = IF(VALUES(verified_ts) > verified_ts, VALUES(scope), scope),"+
			" verified_at = IF(VALUES(verified_ts) > verified_ts, VALUES(verified_at), verified_at),"+
			" verified_ts = GREATEST(verified_ts, VALUES(verified_ts))",
			v.Changefeed, v.Schema, v.Table, v.Ts, v.RunID, truncateRunes(v.Scope, 128), v.At.UTC())
	}
	if err != nil {
		return false, fmt.Errorf("record the verification of %s.%s at %d: %w", v.Schema, v.Table, v.Ts, err)
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// lastVerification returns the last clean verification of the upstream table
// schema.table for changefeed; ok is false when none is recorded.
func lastVerification(ctx context.Context, db *sql.DB, metaSchema, changefeed, schema, table string) (v Verification, ok bool, err error) {
	vs, err := verifications(ctx, db, metaSchema, " AND schema_name = ? AND table_name = ?", changefeed, schema, table)
	if err != nil || len(vs) == 0 {
		return Verification{}, false, err
	}
	return vs[0], true, nil
}

// Verifications returns the last clean verification of every table recorded for
// changefeed, by schema and table.
func Verifications(ctx context.Context, db *sql.DB, metaSchema, changefeed string) ([]Verification, error) {
	return verifications(ctx, db, metaSchema, "", changefeed)
}

func verifications(ctx context.Context, q Querier, metaSchema, clause string, changefeed string, args ...any) ([]Verification, error) {
	rows, err := q.QueryContext(ctx, "SELECT schema_name, table_name, verified_ts, run_id, scope, CAST(verified_at AS CHAR) FROM "+
		ident.Table(metaSchema, verifiedTable)+" WHERE changefeed = ?"+clause+" ORDER BY schema_name, table_name", append([]any{changefeed}, args...)...)
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == 1146 {
		return nil, nil // no checker run has migrated the meta schema yet: nothing verified
	}
	if err != nil {
		return nil, fmt.Errorf("read verifications of changefeed %s: %w", changefeed, err)
	}
	defer rows.Close()
	var out []Verification
	for rows.Next() {
		v := Verification{Changefeed: changefeed}
		var at string
		if err := rows.Scan(&v.Schema, &v.Table, &v.Ts, &v.RunID, &v.Scope, &at); err != nil {
			return nil, fmt.Errorf("read verifications of changefeed %s: %w", changefeed, err)
		}
		v.At, _ = time.ParseInLocation("2006-01-02 15:04:05.999", strings.TrimSpace(at), time.UTC)
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read verifications of changefeed %s: %w", changefeed, err)
	}
	return out, nil
}

// lastVerified is lastVerification on the run's meta schema.
func (s *store) lastVerified(ctx context.Context, changefeed, schema, table string) (Verification, bool, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	vs, err := verifications(ctx, s.db, s.raw, " AND schema_name = ? AND table_name = ?", changefeed, schema, table)
	if err != nil || len(vs) == 0 {
		return Verification{}, false, err
	}
	return vs[0], true, nil
}

// recordVerified records the clean verification of every table the run found equal at
// a snapshot pair, at the point its comparison covers (tableScope.until): when the table
// was compared whole (a full run, or a keyless table), or its keys were those of a
// cdc-scoped window, or of a since: window starting no later than the table's last clean
// verification. A table with a row filter or ignored columns is not verified whole, nor
// is any table of a run not at a snapshot pair. It returns the tables whose verification moved.
func (r *runner) recordVerified(ctx context.Context, targets []*target, scopes []*tableScope) (int, error) {
	if r.cfg.Changefeed.ID == "" || scopes == nil {
		return 0, nil
	}
	if _, atPair := r.pair.pairTS(); !atPair {
		return 0, nil
	}
	spec := r.cfg.scope
	n := 0
	for i, t := range targets {
		sc := scopes[i]
		if sc == nil || t.fatal || t.plan == nil || sc.until == 0 || t.plan.Where != "" || len(t.plan.Carried) > 0 || !structureEqual(t.problems) {
			continue
		}
		tl := r.track.tally(t.idx)
		tl.mu.Lock()
		equal := tl.differences == 0 && tl.undrilled == 0 && tl.splitDone && tl.chunksDone == tl.chunks
		tl.mu.Unlock()
		if !equal {
			continue
		}
		v := Verification{Changefeed: r.cfg.Changefeed.ID, Schema: t.stored.upSchema, Table: t.stored.upTable,
			Ts: sc.until, RunID: r.st.runID, Scope: spec.String()}
		after := uint64(0)
		if sc.mode == tableKeys && spec.Kind == ScopeSince {
			after = max(sc.from, 1) // only over a verification at or after the window's start
		}
		ctx, cancel := r.st.ctx(ctx)
		changed, err := recordVerificationN(ctx, r.st.db, r.st.raw, v, after)
		cancel()
		if err != nil {
			return n, err
		}
		if changed {
			n++
		}
	}
	return n, nil
}
