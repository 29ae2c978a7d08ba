package main

// dirty.go times a cdc-scoped diff (#17): `parity diff --scope cdc` over the TiDB →
// fallback pair's table, whose changefeed ledger (written here as the applier writes it,
// in its meta schema: internal/ledger's contract) holds -dirty keys changed since the
// table's last clean verification. The tables are the dataset's, identical on both
// sides; the target is the time to verify 100,000 dirty keys (issue 17: <= 5 s on the
// 2-core test machine), printed with parity's max RSS.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/ledger"
	"github.com/tidb-parity/parity/internal/metaschema"
	"github.com/tidb-parity/parity/internal/rowkey"
	"github.com/tidb-parity/parity/internal/tso"

	_ "github.com/tidb-parity/parity/cdc" // registers the applier's meta tables (the ledger's) for the migration
)

// Names of the dirty-key case's changefeed and meta schema on the fallback.
const (
	dirtyChangefeed = "bench-dirty"
	dirtyMeta       = "bench_dirty_meta"
)

// dirtyTarget is issue 17's target for verifying 100,000 dirty keys in cdc scope.
const dirtyTarget = 5 * time.Second

// dirtyResult is the dirty-key case's measurements.
type dirtyResult struct {
	keys      int
	parity    Result
	scopeKeys int64
	rows      int64
	equal     bool
	full      time.Duration // the identical case's full parity run of the same table (0: not run)
}

// benchDirty writes a ledger of o.dirty keys of p's table changed after a clean
// verification and times `parity diff --scope cdc` over it (fastest of o.repeat runs).
func benchDirty(ctx context.Context, o options, data Dataset, p *pair) (*dirtyResult, error) {
	down := p.down.S // the fallback: the applier's meta schema lives there
	if err := metaschema.Migrate(ctx, down.DB, dirtyMeta, time.Minute); err != nil {
		return nil, err
	}
	now, err := currentTSO(ctx, p.up.S)
	if err != nil {
		return nil, err
	}
	verified := tso.FromTime(tso.Time(now).Add(-2 * time.Minute))
	since := tso.FromTime(tso.Time(now).Add(-time.Hour))
	// The dirty keys: o.dirty of the dataset's ids, spread over rounds of 10,000 keys
	// after the verification, as the applier writes them.
	var ids []int64
	data.ForEachID(1, data.MaxID(), func(id int64) { ids = append(ids, id) })
	if o.dirty > len(ids) {
		return nil, fmt.Errorf("-dirty %d: the table has %d rows", o.dirty, len(ids))
	}
	rng := rand.New(rand.NewPCG(data.Seed, 17))
	rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	ids = ids[:o.dirty]
	q := func(s string) string { return metaschema.Q(ident.Quote(dirtyMeta), s) }
	for _, s := range []string{
		"DELETE FROM %s." + ledger.Table + " WHERE changefeed = ?",
		"DELETE FROM %s." + ledger.RangeTable + " WHERE changefeed = ?",
		"DELETE FROM %s." + ledger.CheckpointTable + " WHERE changefeed = ?",
		"DELETE FROM %s.diff_verified WHERE changefeed = ?",
	} {
		if _, err := down.DB.ExecContext(ctx, q(s), dirtyChangefeed); err != nil {
			return nil, fmt.Errorf("reset the dirty-key case: %w", err)
		}
	}
	const roundKeys = 10000
	rounds := (len(ids) + roundKeys - 1) / roundKeys
	step := (now - verified) / uint64(rounds+1)
	for r := 0; r < rounds; r++ {
		maxTs := verified + uint64(r+1)*step
		var es []ledger.Entry
		for _, id := range ids[r*roundKeys : min(len(ids), (r+1)*roundKeys)] {
			k, err := rowkey.Encode(id)
			if err != nil {
				return nil, err
			}
			es = append(es, ledger.Entry{Key: k, CommitTs: maxTs - uint64(id%100)})
		}
		es = ledger.Compact(es)
		minTs := maxTs - 99
		blob, err := ledger.Encode(es, minTs)
		if err != nil {
			return nil, err
		}
		if _, err := down.DB.ExecContext(ctx, q("INSERT INTO %s."+ledger.Table+" (changefeed, max_ts, schema_name, table_name, part, min_ts, key_count, entries) VALUES (?, ?, ?, ?, 0, ?, ?, ?)"),
			dirtyChangefeed, maxTs, p.up.DB, p.up.Name, minTs, len(es), blob); err != nil {
			return nil, fmt.Errorf("write the ledger: %w", err)
		}
	}
	if _, err := down.DB.ExecContext(ctx, q("INSERT INTO %s."+ledger.RangeTable+" (changefeed, since_ts) VALUES (?, ?)"), dirtyChangefeed, since); err != nil {
		return nil, err
	}
	if _, err := down.DB.ExecContext(ctx, q("INSERT INTO %s."+ledger.CheckpointTable+" (changefeed, applied_ts) VALUES (?, ?)"), dirtyChangefeed, now); err != nil {
		return nil, err
	}
	if err := checker.RecordVerification(ctx, down.DB, dirtyMeta, checker.Verification{Changefeed: dirtyChangefeed,
		Schema: p.up.DB, Table: p.up.Name, Ts: verified, RunID: "diffbench", Scope: checker.ScopeFull}); err != nil {
		return nil, err
	}

	res := &dirtyResult{keys: len(ids)}
	dir := filepath.Join(o.workDir, "tidb-dirty")
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	// The run's state goes to the changefeed's meta schema, where its clean
	// verifications are.
	conf := filepath.Join(o.workDir, "dirty.toml")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("meta-schema = %q\n", dirtyMeta)), 0o644); err != nil {
		return nil, err
	}
	for i := 0; i < max(o.repeat, 1); i++ {
		out := filepath.Join(dir, fmt.Sprintf("parity-%d", i+1))
		if err := os.MkdirAll(out, 0o755); err != nil {
			return nil, err
		}
		args := []string{"diff", "--config", conf,
			"--upstream", p.up.S.DSN, "--downstream", p.down.S.DSN,
			"--table", p.up.DB + "." + p.up.Name, "--output", filepath.Join(out, "output"),
			"--scope", "cdc", "--changefeed", dirtyChangefeed, "--changefeed-meta-schema", dirtyMeta}
		args = append(args, strings.Fields(o.parityArgs)...)
		cmd := exec.CommandContext(ctx, o.parity, args...)
		logPath := filepath.Join(out, "parity.log")
		logf, err := os.Create(logPath)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(logf, "$ %s %s\n", o.parity, strings.Join(args, " "))
		cmd.Stdout, cmd.Stderr = logf, logf
		slog.Info("running parity, cdc scope", "keys", len(ids), "repeat", i+1)
		r, err := timeProcess(cmd)
		logf.Close()
		if err != nil {
			return nil, fmt.Errorf("run parity (log %s): %w", logPath, err)
		}
		if code := cmd.ProcessState.ExitCode(); code != 0 {
			return nil, fmt.Errorf("parity diff --scope cdc exited %d (log %s)", code, logPath)
		}
		data, err := os.ReadFile(filepath.Join(out, "output", "report.json"))
		if err != nil {
			return nil, fmt.Errorf("parity diff --scope cdc: %w (log %s)", err, logPath)
		}
		var rep struct {
			Equal  bool `json:"equal"`
			Tables []struct {
				Scope       string `json:"scope"`
				ScopeKeys   int64  `json:"scope_keys"`
				RowsChecked int64  `json:"rows_checked"`
			} `json:"tables"`
		}
		if err := json.Unmarshal(data, &rep); err != nil || len(rep.Tables) != 1 {
			return nil, fmt.Errorf("parity diff --scope cdc: report.json: %v", err)
		}
		res.equal, res.scopeKeys, res.rows = rep.Equal, rep.Tables[0].ScopeKeys, rep.Tables[0].RowsChecked
		slog.Info("parity done", "seconds", r.Wall.Seconds(), "scope", rep.Tables[0].Scope, "keys", res.scopeKeys, "rows", res.rows)
		res.parity = best(res.parity, r)
	}
	return res, nil
}

// currentTSO returns a TSO later than every commit on TiDB s: the start ts of a new
// transaction (@@tidb_current_ts is 0 outside one).
func currentTSO(ctx context.Context, s *Server) (uint64, error) {
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("read TiDB's TSO: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	var ts uint64
	if err := tx.QueryRowContext(ctx, "SELECT @@tidb_current_ts").Scan(&ts); err != nil || ts == 0 {
		return 0, fmt.Errorf("read TiDB's TSO: %d, %v", ts, err)
	}
	return ts, nil
}

// printDirty prints the dirty-key case against its target.
func printDirty(w io.Writer, r *dirtyResult, rows int64) {
	fmt.Fprintf(w, "\n== cdc scope: %d dirty keys of a %d-row sbtest1, TiDB vs MariaDB ==\n", r.keys, rows)
	ok := r.equal && r.scopeKeys == int64(r.keys) && r.rows == int64(r.keys)
	note := fmt.Sprintf("%d keys in scope, %d rows compared, equal %v", r.scopeKeys, r.rows, r.equal)
	if r.full > 0 {
		note += fmt.Sprintf("; the full diff of the table took %s", secs(r.full))
	}
	if len(r.parity.Runs) > 1 {
		var rs []string
		for _, d := range r.parity.Runs {
			rs = append(rs, fmt.Sprintf("%.2f", d.Seconds()))
		}
		note += "; runs " + strings.Join(rs, "/") + " s"
	}
	target := time.Duration(float64(dirtyTarget) * float64(r.keys) / 100000)
	x := ratio(r.parity.Wall, target)
	fmt.Fprintf(w, "parity diff --scope cdc: %s, max RSS %s, own CPU %.2f s (%s)\n", secs(r.parity.Wall), rss(r.parity.MaxRSSKB), r.parity.CPU.Seconds(), note)
	fmt.Fprintf(w, "target: <= %s for %d keys: %.2fx of the target: %s\n", secs(target), r.keys, x, verdict(ok && x <= 1))
}
