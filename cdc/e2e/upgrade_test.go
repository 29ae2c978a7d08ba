package e2e

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/tidb-parity/parity/cdc" // registers the "cdc" component whose versions the new binary must record
	"github.com/tidb-parity/parity/cdc/loadgen"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/metaschema"
)

// previousRelease is the release an installed parity is upgraded from: its meta schema
// (serve's checkpoint, offsets and DDL history; diff's runs, chunks, differences and
// re-checks) must be carried forward by this tree's binary. Move it when a release is cut.
const previousRelease = "0d2dbf4a70fba14d46ea2977277313351ad1b8fd"

// TestUpgradeInPlace is #23's "upgrading in place keeps everything": the previous
// release, built from git, writes a meta schema the way an installation has it, and this
// tree's binary is then run on it.
//
//   - serve: the old `parity serve` replicates a loadgen changefeed (TiDB transactions on
//     sysbench tables, alltypes and a keyless table with duplicate rows; the tables
//     created by the changefeed's DDL) and is stopped by SIGTERM while more transactions
//     arrive; more are published while no serve runs. The new serve, on the same meta
//     schema and flags, must record every component in parity_migrations (the legacy
//     schema_migrations and diff_schema_migrations adopted, and left in place), resume
//     at exactly the old checkpoint (its "replicator starting" line: with the checkpoint
//     and offsets deleted, the fallback still ends equal, since keyed rows are
//     idempotent and keyless tables have their own progress rows, so the comparison
//     alone would not see a lost checkpoint), keep the old DDL history and offsets, and
//     leave the fallback equal to TiDB at the last resolved ts: nothing lost and no
//     keyless row applied twice.
//   - diff: in the same meta schema (the fallback is the diff's downstream, the peer
//     MariaDB its upstream), the old `parity diff` finishes one run whose re-check
//     resolves a difference fixed meanwhile, and is SIGKILLed in a second, rate-capped
//     run once a table's first chunk and at least 6 chunks are stored done. After the
//     new serve has migrated the schema, the new `parity diff --resume` continues that
//     run and must report exactly the known differences (those the old binary stored
//     and those it had not reached, in a keyed, a composite-string-keyed and a keyless
//     table) with every upstream row counted, without comparing again the chunks the old
//     run had done (their attempts and times unchanged, and a row changed after the kill
//     inside a done chunk not reported); `--resume` of the finished run reports its
//     differences and its resolved count as the old binary did.
func TestUpgradeInPlace(t *testing.T) {
	e := newEnv(t, 3, true)
	oldBin := previousBinary(t, previousRelease)
	meta := e.open(e.downDSN, "")
	dir := t.TempDir()

	// --- serve, old release -------------------------------------------------------
	e.logPath = filepath.Join(dir, "serve-old.log")
	old := e.startServeBin(oldBin, filepath.Join(dir, "spill-old"))
	cfg := e.loadgenConfig()
	cfg.Dispatcher = loadgen.DispatchIndexValue
	cfg.Transactions = 300
	cfg.Seed = 21
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	first := <-startLoadgen(ctx, cfg)
	if first.err != nil {
		t.Fatalf("loadgen (first part): %v", first.err)
	}
	e.waitApplied(old, first.res.ResolvedTs, time.Minute)
	// More transactions while the old serve runs; it is stopped in their midst.
	cfg.Transactions, cfg.Rate, cfg.Seed = 450, 150, 22
	during := startLoadgen(ctx, cfg)
	e.waitAppliedPast(old, first.res.ResolvedTs, 5*time.Second)
	old.stop(t)
	var second loadResult
	midway := false
	select {
	case second = <-during:
	default:
		midway = true
		second = <-during
	}
	oldCheckpoint := queryUint(t, meta, "SELECT applied_ts FROM "+metaschema.Table(e.meta, "checkpoint")+" WHERE changefeed = ?", e.meta)
	if got := logResolvedTs(t, e.logPath, "replicator stopped", false); got != oldCheckpoint {
		t.Fatalf("the old serve said it stopped at %d, its checkpoint row holds %d", got, oldCheckpoint)
	}
	if second.err != nil {
		t.Fatalf("loadgen (during the stop): %v", second.err)
	}
	// And more while no serve runs: the new binary alone applies these.
	cfg.Transactions, cfg.Rate, cfg.Seed = 300, 0, 23
	third := <-startLoadgen(ctx, cfg)
	if third.err != nil {
		t.Fatalf("loadgen (after the stop): %v", third.err)
	}
	finalTs := third.res.ResolvedTs
	if oldCheckpoint >= finalTs || oldCheckpoint < first.res.ResolvedTs {
		t.Fatalf("old checkpoint %d is not between the first part's resolved ts %d and the last %d", oldCheckpoint, first.res.ResolvedTs, finalTs)
	}
	beyond := queryUint(t, meta, "SELECT COUNT(*) FROM "+metaschema.Table(e.meta, "table_progress")+" WHERE changefeed = ? AND applied_ts > ?", e.meta, oldCheckpoint)
	t.Logf("old serve stopped (while the second part ran: %v) at checkpoint %d (first part resolved at %d; %d keyless tables applied beyond it); %d+%d+%d transactions published, final resolved ts %d",
		midway, oldCheckpoint, first.res.ResolvedTs, beyond, first.res.Transactions, second.res.Transactions, third.res.Transactions, finalTs)

	// --- diff, old release --------------------------------------------------------
	d := newUpgradeDiff(t, e, oldBin, dir)
	d.runFinished()
	d.runKilled()

	before := readMetaState(t, meta, e.meta, e.meta)
	if len(before.ddls) == 0 || len(before.offsets) != e.partitions || len(before.legacyCDC) == 0 || before.legacyChecker == 0 {
		t.Fatalf("the old release wrote an unexpected meta schema: %d DDLs, offsets %v, schema_migrations %v, diff_schema_migrations at %d",
			len(before.ddls), before.offsets, before.legacyCDC, before.legacyChecker)
	}

	// --- serve, this tree ---------------------------------------------------------
	e.logPath = filepath.Join(dir, "serve-new.log")
	cur := e.startServeBin(parityBin, filepath.Join(dir, "spill-new"))
	e.waitApplied(cur, finalTs, time.Minute)
	if got := logResolvedTs(t, e.logPath, "replicator starting", true); got != oldCheckpoint {
		t.Errorf("the new serve started from resolved ts %d, the old checkpoint is %d", got, oldCheckpoint)
	}
	cur.stop(t)
	e.compareAt(finalTs)

	// --- diff, this tree ----------------------------------------------------------
	d.bin = parityBin
	d.resumeKilled()
	d.resumeFinished()

	// --- the meta schema after the upgrade ----------------------------------------
	after := readMetaState(t, meta, e.meta, e.meta)
	checkMigrations(t, meta, e.meta, before, after)

	// --- rolling back: the previous release refuses the upgraded schema ------------
	// (it would apply rows without writing the ledger the new release's readers trust)
	e.logPath = filepath.Join(dir, "serve-rollback.log")
	back := e.startServeBin(oldBin, filepath.Join(dir, "spill-back"))
	select {
	case <-back.done:
	case <-time.After(time.Minute):
		t.Fatal("the previous release kept running on the upgraded meta schema")
	}
	if logText, _ := os.ReadFile(e.logPath); back.err == nil || !strings.Contains(string(logText), "newer than this binary") {
		t.Errorf("the previous release on the upgraded schema: exit %v, log:\n%s", back.err, logText)
	}
	if got := queryUint(t, meta, "SELECT applied_ts FROM "+metaschema.Table(e.meta, "checkpoint")+" WHERE changefeed = ?", e.meta); got != after.checkpoint {
		t.Errorf("the refused previous release moved the checkpoint from %d to %d", after.checkpoint, got)
	}
	for k, q := range before.ddls {
		if after.ddls[k] != q {
			t.Errorf("ddl_applied row %s: was %q, now %q", k, q, after.ddls[k])
		}
	}
	for p, off := range before.offsets {
		if after.offsets[p] < off {
			t.Errorf("partition %d offset went back from %d to %d", p, off, after.offsets[p])
		}
	}
	if after.checkpoint < finalTs {
		t.Errorf("checkpoint after the new serve is %d, want at least %d", after.checkpoint, finalTs)
	}
	for id, st := range after.runs {
		if st != "done" {
			t.Errorf("diff run %s is %s after the new binary resumed it", id, st)
		}
	}
	if len(after.runs) != 2 {
		t.Errorf("diff runs after the upgrade: %v, want the 2 the old release started", after.runs)
	}
	if after.resolved[d.finishedID] != before.resolved[d.finishedID] || before.resolved[d.finishedID] != 1 {
		t.Errorf("diff_rechecks of the finished run: %d resolved before, %d after (want 1 both)", before.resolved[d.finishedID], after.resolved[d.finishedID])
	}
}

// previousBinary returns the parity binary of commit, built once from the repository's
// own history (git archive + go build) and kept in the user cache directory: CI runs on
// a full clone with a warm module cache, so this costs one build per machine.
func previousBinary(t *testing.T, commit string) string {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	git := func(args ...string) (string, error) {
		cmd := exec.Command("git", args...)
		cmd.Dir = root
		out, err := cmd.Output()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return strings.TrimSpace(string(out)), err
	}
	if _, err := git("rev-parse", "--verify", "--quiet", commit+"^{commit}"); err != nil {
		shallow, _ := git("rev-parse", "--is-shallow-repository")
		t.Fatalf("the previous release %s is not in this clone's history (shallow: %s; %v): the upgrade test builds it from git; "+
			"fetch the full history (git fetch --unshallow), as CI does", commit, shallow, err)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "parity-upgrade-"+commit)
	bin := filepath.Join(dir, "parity")
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() {
		return bin
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	start := time.Now()
	archive := exec.Command("sh", "-c", `git archive --format=tar "$1" | tar -x -C "$2"`, "sh", commit, src)
	archive.Dir = root
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", commit, err, out)
	}
	tmp := filepath.Join(dir, fmt.Sprintf("parity.%d.tmp", os.Getpid()))
	build := exec.Command("go", "build", "-o", tmp, "./cmd/parity")
	build.Dir = src
	build.Env = append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		_ = os.Remove(tmp)
		t.Fatalf("building parity at %s: %v\n%s", commit, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil { // atomic: a concurrent run sees a whole binary or none
		t.Fatal(err)
	}
	t.Logf("built parity %s in %v (cached at %s)", commit[:7], time.Since(start).Round(time.Millisecond), bin)
	return bin
}

// startServeBin starts `parity serve` of binary bin with this environment's settings as
// flags, which both the old and the new release read the same way, logging to e.logPath.
func (e *env) startServeBin(bin, spillDir string) *serve {
	e.t.Helper()
	args := []string{"serve",
		"--changefeed-id", e.meta, "--brokers", e.broker, "--topics", e.topic, "--time-zone", "+00:00",
		"--downstream-dsn", e.downDSN, "--meta-schema", e.meta, "--spill-dir", spillDir,
		"--status-addr", e.statusAddr, "--log-level", "info", "--workers", "4"}
	if bin == parityBin { // the release before the gRPC API has no --api-addr
		args = append(args, "--api-addr", "")
	}
	return e.startServeCmd(exec.Command(bin, args...))
}

// waitAppliedPast waits up to timeout for serve's checkpoint to move beyond ts, so that
// a stop lands while it applies; it is not an error if it does not.
func (e *env) waitAppliedPast(s *serve, ts uint64, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := e.status(ctx)
		cancel()
		if err == nil && st.AppliedTs > ts {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logResolvedTs returns resolved_ts of serve's first (first=true) or last log line
// with message msg.
func logResolvedTs(t *testing.T, path, msg string, first bool) uint64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`msg="` + regexp.QuoteMeta(msg) + `".*?\bresolved_ts=(\d+)`)
	m := re.FindAllSubmatch(b, -1)
	if len(m) == 0 {
		t.Fatalf("%s has no %q line with resolved_ts", path, msg)
	}
	line := m[len(m)-1]
	if first {
		line = m[0]
	}
	ts, err := strconv.ParseUint(string(line[1]), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

func queryUint(t *testing.T, db *sql.DB, q string, args ...any) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var v uint64
	if err := db.QueryRowContext(ctx, q, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return v
}

// queryRows runs q and calls row for each result row.
func queryRows(t *testing.T, db *sql.DB, q string, row func(*sql.Rows) error, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := row(rows); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// metaState is what the test reads from the meta schema with plain SQL. The diff_*
// tables and the two legacy version tables are named as the previous release created
// them: their names are fixed by the binaries already installed.
type metaState struct {
	checkpoint    uint64
	offsets       map[int]int64
	ddls          map[string]string // "commit_ts/query_hash" → query
	legacyCDC     map[int]string    // schema_migrations: version → name
	legacyChecker int               // MAX(version) of diff_schema_migrations, below the seal
	checkerSealed bool              // diff_schema_migrations holds metaschema.LegacySealVersion
	runs          map[string]string // diff run → state
	resolved      map[string]int64  // diff run → SUM(diff_rechecks.resolved)
}

func readMetaState(t *testing.T, db *sql.DB, schema, changefeed string) metaState {
	t.Helper()
	st := metaState{offsets: map[int]int64{}, ddls: map[string]string{}, legacyCDC: map[int]string{},
		runs: map[string]string{}, resolved: map[string]int64{}}
	st.checkpoint = queryUint(t, db, "SELECT applied_ts FROM "+metaschema.Table(schema, "checkpoint")+" WHERE changefeed = ?", changefeed)
	queryRows(t, db, "SELECT kafka_partition, next_offset FROM "+metaschema.Table(schema, "partition_offset")+" WHERE changefeed = ?",
		func(r *sql.Rows) error {
			var p int
			var off int64
			err := r.Scan(&p, &off)
			st.offsets[p] = off
			return err
		}, changefeed)
	queryRows(t, db, "SELECT commit_ts, query_hash, query FROM "+metaschema.Table(schema, "ddl_applied")+" WHERE changefeed = ?",
		func(r *sql.Rows) error {
			var ts uint64
			var h, q string
			err := r.Scan(&ts, &h, &q)
			st.ddls[fmt.Sprintf("%d/%s", ts, h)] = q
			return err
		}, changefeed)
	queryRows(t, db, "SELECT version, name FROM "+ident.Table(schema, "schema_migrations"), func(r *sql.Rows) error {
		var v int
		var n string
		err := r.Scan(&v, &n)
		st.legacyCDC[v] = n
		return err
	})
	st.legacyChecker = int(queryUint(t, db, "SELECT COALESCE(MAX(version), 0) FROM "+ident.Table(schema, "diff_schema_migrations")+" WHERE version < ?", metaschema.LegacySealVersion))
	st.checkerSealed = queryUint(t, db, "SELECT COUNT(*) FROM "+ident.Table(schema, "diff_schema_migrations")+" WHERE version = ?", metaschema.LegacySealVersion) == 1
	queryRows(t, db, "SELECT run_id, state FROM "+ident.Table(schema, "diff_runs"), func(r *sql.Rows) error {
		var id, s string
		err := r.Scan(&id, &s)
		st.runs[id] = s
		return err
	})
	queryRows(t, db, "SELECT run_id, SUM(resolved) FROM "+ident.Table(schema, "diff_rechecks")+" GROUP BY run_id", func(r *sql.Rows) error {
		var id string
		var n int64
		err := r.Scan(&id, &n)
		st.resolved[id] = n
		return err
	})
	return st
}

// checkMigrations: every component the new binary registers is recorded at its latest
// version in parity_migrations, versions 1..n with none missing; a legacy version table
// is adopted (its versions recorded under the same step names) and left as it was.
func checkMigrations(t *testing.T, db *sql.DB, schema string, before, after metaState) {
	t.Helper()
	recorded := map[string]map[int]string{}
	queryRows(t, db, "SELECT component, version, name FROM "+ident.Table(schema, metaschema.VersionTable), func(r *sql.Rows) error {
		var c, n string
		var v int
		err := r.Scan(&c, &v, &n)
		if recorded[c] == nil {
			recorded[c] = map[int]string{}
		}
		recorded[c][v] = n
		return err
	})
	contiguous := func(c string) int {
		vs := recorded[c]
		for v := 1; v <= len(vs); v++ {
			if _, ok := vs[v]; !ok {
				t.Errorf("%s: component %q has versions %v: version %d is missing", metaschema.VersionTable, c, slices.Sorted(maps.Keys(vs)), v)
			}
		}
		return len(vs)
	}
	for c, want := range metaschema.Versions() {
		if got := contiguous(c); got != want {
			t.Errorf("%s: component %q at version %d, this binary's latest is %d", metaschema.VersionTable, c, got, want)
		}
	}
	// The applier's schema_migrations: adopted under "cdc", its rows kept, and sealed
	// with a version no earlier release knows (so that release refuses the schema).
	for v, name := range before.legacyCDC {
		if recorded["cdc"][v] != name {
			t.Errorf("schema_migrations version %d (%q) adopted as %q", v, name, recorded["cdc"][v])
		}
	}
	sealed := maps.Clone(after.legacyCDC)
	if _, ok := sealed[metaschema.LegacySealVersion]; !ok {
		t.Errorf("schema_migrations not sealed with version %d: %v", metaschema.LegacySealVersion, after.legacyCDC)
	}
	delete(sealed, metaschema.LegacySealVersion)
	if !maps.Equal(before.legacyCDC, sealed) {
		t.Errorf("schema_migrations's rows changed by the upgrade: %v → %v", before.legacyCDC, after.legacyCDC)
	}
	if !after.checkerSealed {
		t.Error("diff_schema_migrations not sealed")
	}
	// The checker's diff_schema_migrations: adopted under "checker" (a package this test
	// does not import: cdc must not depend on checker), then left alone.
	if got := contiguous("checker"); got < before.legacyChecker {
		t.Errorf("%s: checker at version %d, below the %d of the diff_schema_migrations the previous release wrote", metaschema.VersionTable, got, before.legacyChecker)
	}
	if after.legacyChecker != before.legacyChecker {
		t.Errorf("diff_schema_migrations moved from %d to %d after its adoption", before.legacyChecker, after.legacyChecker)
	}
	names := make([]string, 0, len(recorded))
	for c, vs := range recorded {
		names = append(names, fmt.Sprintf("%s %d", c, len(vs)))
	}
	sort.Strings(names)
	t.Logf("%s after the upgrade: %s", metaschema.VersionTable, strings.Join(names, ", "))
}
