package e2e

import (
	"context"
	"database/sql"
	"encoding/json"
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
	"github.com/tidb-parity/parity/internal/testenv"
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

// upgradeDiff is the diff half: a database of the same name on the peer MariaDB
// (upstream) and the fallback (downstream, which also holds the meta schema).
type upgradeDiff struct {
	t          *testing.T
	e          *env
	bin        string // the parity binary the next command runs
	dir        string
	db         string
	upDSN      string
	downDSN    string
	down       *sql.DB
	meta       *sql.DB
	config     string            // TOML with meta_schema: the one setting without a flag
	finishedID string            // the run the old binary finished (with a resolved re-check)
	killedID   string            // the run the old binary was killed in
	killedDone map[string]string // its chunks done at the kill: "table/seq" → attempts and time
}

// The killed run's tables with their upstream rows, and the differences planted
// downstream as the report lists them: "kind col=value,... [differing columns]".
var (
	upgradeDiffRows = map[string]int64{"c": 6000, "k": 300, "t": 24000}
	upgradeDiffWant = map[string][]string{
		"c": {"differing g='g003',n=7 [v]", "missing g='g050',n=50"},
		"k": {"extra a=7,b='x'"},
		"t": {"differing id=12345 [d]", "differing id=5 [v]", "extra id=24005", "missing id=23990"},
	}
)

func newUpgradeDiff(t *testing.T, e *env, bin, dir string) *upgradeDiff {
	t.Helper()
	d := &upgradeDiff{t: t, e: e, bin: bin, dir: dir, db: testenv.UniqueName("pupg"),
		upDSN: testenv.Require(t, testenv.EnvMySQL), downDSN: e.downDSN}
	up := e.open(d.upDSN, "")
	d.down, d.meta = e.open(d.downDSN, ""), e.open(d.downDSN, "")
	q := ident.Quote(d.db)
	for _, db := range []*sql.DB{up, d.down} {
		d.exec(db, "CREATE DATABASE "+q)
		t.Cleanup(func() {
			if os.Getenv("PARITY_TEST_KEEP") != "1" {
				_, _ = db.Exec("DROP DATABASE IF EXISTS " + q)
			}
		})
		for _, s := range []string{
			"CREATE TABLE %[1]s.t (id INT PRIMARY KEY, v VARCHAR(32) NOT NULL, d DECIMAL(12,2), at DATETIME)",
			"INSERT INTO %[1]s.t SELECT seq, CONCAT('v', seq), seq / 7, '2026-01-01' + INTERVAL seq MINUTE FROM %[1]s.seq_1_to_24000",
			"CREATE TABLE %[1]s.c (g VARCHAR(16) NOT NULL, n INT NOT NULL, v VARCHAR(32), PRIMARY KEY (g, n))",
			"INSERT INTO %[1]s.c SELECT CONCAT('g', LPAD(seq DIV 100, 3, '0')), seq MOD 100, CONCAT('c', seq) FROM %[1]s.seq_0_to_5999",
			"CREATE TABLE %[1]s.k (a INT NOT NULL, b VARCHAR(10))",
			"INSERT INTO %[1]s.k SELECT seq MOD 50, 'x' FROM %[1]s.seq_1_to_300",
			"CREATE TABLE %[1]s.r (id INT PRIMARY KEY, v VARCHAR(32))",
			"INSERT INTO %[1]s.r SELECT seq, CONCAT('r', seq) FROM %[1]s.seq_1_to_200",
		} {
			d.exec(db, fmt.Sprintf(s, q))
		}
	}
	for _, s := range []string{
		"UPDATE %[1]s.t SET v = 'changed' WHERE id = 5",
		"UPDATE %[1]s.t SET d = d + 1 WHERE id = 12345",
		"DELETE FROM %[1]s.t WHERE id = 23990",
		"INSERT INTO %[1]s.t VALUES (24005, 'extra', 1, NULL)",
		"UPDATE %[1]s.c SET v = 'changed' WHERE g = 'g003' AND n = 7",
		"DELETE FROM %[1]s.c WHERE g = 'g050' AND n = 50",
		"INSERT INTO %[1]s.k VALUES (7, 'x')",
		"UPDATE %[1]s.r SET v = 'in flight' WHERE id = 3",
		"UPDATE %[1]s.r SET v = 'changed' WHERE id = 9",
	} {
		d.exec(d.down, fmt.Sprintf(s, q))
	}
	d.config = filepath.Join(dir, "diff.toml")
	// meta_schema has no flag; the previous release reads only this snake_case spelling.
	if err := os.WriteFile(d.config, []byte(fmt.Sprintf("meta_schema = %q\n", e.meta)), 0o644); err != nil {
		t.Fatal(err)
	}
	return d
}

func (d *upgradeDiff) exec(db *sql.DB, q string) {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, q); err != nil {
		d.t.Fatalf("%s: %v", q, err)
	}
}

// table names a diff table of the meta schema as the previous release created it.
func (d *upgradeDiff) table(name string) string { return ident.Table(d.e.meta, name) }

func (d *upgradeDiff) count(q string, args ...any) int {
	d.t.Helper()
	return int(queryUint(d.t, d.meta, q, args...))
}

// diffProc is a running `parity diff`.
type diffProc struct {
	cmd     *exec.Cmd
	out     string // --output
	logPath string
	done    chan struct{}
	err     error // valid after done
}

// start starts d.bin's `parity diff` with the flags both releases take.
func (d *upgradeDiff) start(name string, tables []string, extra ...string) *diffProc {
	d.t.Helper()
	p := &diffProc{out: filepath.Join(d.dir, name), logPath: filepath.Join(d.dir, name+".log"), done: make(chan struct{})}
	args := []string{"diff", "--config", d.config, "--upstream", d.upDSN, "--downstream", d.downDSN, "--output", p.out}
	for _, tb := range tables {
		args = append(args, "--table", d.db+"."+tb)
	}
	p.cmd = exec.Command(d.bin, append(args, extra...)...)
	logf, err := os.Create(p.logPath)
	if err != nil {
		d.t.Fatal(err)
	}
	defer logf.Close()
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	d.t.Cleanup(func() { _ = p.cmd.Process.Kill(); <-p.done })
	return p
}

// wait waits for the command, logs its output and returns its exit code.
func (d *upgradeDiff) wait(p *diffProc) int {
	d.t.Helper()
	select {
	case <-p.done:
	case <-time.After(2 * time.Minute):
		d.t.Fatalf("%s did not end within 2 minutes", p.logPath)
	}
	var ee *exec.ExitError
	if p.err != nil && !errors.As(p.err, &ee) {
		d.t.Fatal(p.err)
	}
	log, _ := os.ReadFile(p.logPath)
	d.t.Logf("%s (%s):\n%s", filepath.Base(p.logPath), d.bin, log)
	return p.cmd.ProcessState.ExitCode()
}

// poll checks cond every 20ms for up to a minute; the diff must not end meanwhile.
func (d *upgradeDiff) poll(p *diffProc, what string, cond func() bool) {
	d.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		select {
		case <-p.done:
			log, _ := os.ReadFile(p.logPath)
			d.t.Fatalf("parity diff ended (%v) before %s:\n%s", p.err, what, log)
		default:
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("parity diff: no %s within a minute", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runFinished: the old binary compares r with a 4s re-check delay; once its chunks are
// stored done, id 3 is repaired downstream as replication would repair it, so the
// finished run reports id 9 and one difference resolved by its re-check.
func (d *upgradeDiff) runFinished() {
	t := d.t
	p := d.start("finished-old", []string{"r"}, "--recheck-delay", "4s")
	var runID string
	d.poll(p, "the finished run's chunks done", func() bool {
		if runID == "" {
			if d.count("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = 'diff_runs'", d.e.meta) == 0 {
				return false
			}
			queryRows(t, d.meta, "SELECT run_id FROM "+d.table("diff_runs"), func(r *sql.Rows) error { return r.Scan(&runID) })
			if runID == "" {
				return false
			}
		}
		split := d.count("SELECT COUNT(*) FROM "+d.table("diff_tables")+" WHERE run_id = ? AND split_done = 1", runID)
		undone := d.count("SELECT COUNT(*) FROM "+d.table("diff_chunks")+" WHERE run_id = ? AND state <> 'done'", runID)
		return split == 1 && undone == 0
	})
	d.exec(d.down, "UPDATE "+ident.Table(d.db, "r")+" SET v = 'r3' WHERE id = 3")
	if code := d.wait(p); code != 1 {
		t.Fatalf("old parity diff of r: exit %d, want 1 (differences)", code)
	}
	d.finishedID = runID
	rep := readDiffReport(t, p.out)
	checkReport(t, "old release, finished run", rep, runID, map[string][]string{"r": {"differing id=9 [v]"}}, map[string]int64{"r": 200})
	if tb := rep.table("r"); tb == nil || tb.DifferencesResolved != 1 {
		t.Fatalf("old release, finished run: want 1 difference resolved by the re-check (id 3 repaired before it): %+v", tb)
	}
}

// runKilled: the old binary compares t, c and k at 3,000 rows/s and is SIGKILLed once
// t's first chunk and at least 6 chunks are stored done; then a row of that first chunk
// changes downstream, which the resumed run must not compare again.
func (d *upgradeDiff) runKilled() {
	t := d.t
	p := d.start("killed-old", []string{"t", "c", "k"}, "--max-rows-per-second", "3000", "--concurrency", "2")
	var runID string
	tIdx := -1
	d.poll(p, "6 chunks stored done", func() bool {
		if runID == "" {
			queryRows(t, d.meta, "SELECT run_id FROM "+d.table("diff_runs")+" WHERE run_id <> ?", func(r *sql.Rows) error { return r.Scan(&runID) }, d.finishedID)
			if runID == "" {
				return false
			}
		}
		if tIdx < 0 {
			queryRows(t, d.meta, "SELECT table_idx FROM "+d.table("diff_tables")+" WHERE run_id = ? AND up_table = 't'", func(r *sql.Rows) error { return r.Scan(&tIdx) }, runID)
			if tIdx < 0 {
				return false
			}
		}
		first := d.count("SELECT COUNT(*) FROM "+d.table("diff_chunks")+" WHERE run_id = ? AND table_idx = ? AND seq = 0 AND state = 'done'", runID, tIdx)
		return first == 1 && d.count("SELECT COUNT(*) FROM "+d.table("diff_chunks")+" WHERE run_id = ? AND state = 'done'", runID) >= 6
	})
	_ = p.cmd.Process.Kill()
	<-p.done
	d.killedID = runID
	if n := d.count("SELECT COUNT(*) FROM "+d.table("diff_runs")+" WHERE run_id = ? AND state = 'running'", runID); n != 1 {
		t.Fatalf("run %s was not left running by the kill: it ended before it", runID)
	}
	d.killedDone = d.doneChunks(runID)
	total := d.count("SELECT COUNT(*) FROM "+d.table("diff_chunks")+" WHERE run_id = ?", runID)
	stored := d.count("SELECT COUNT(*) FROM "+d.table("diff_differences")+" WHERE run_id = ?", runID)
	t.Logf("old run %s killed with %d of its %d stored chunks done and %d differences stored", runID, len(d.killedDone), total, stored)
	d.exec(d.down, "UPDATE "+ident.Table(d.db, "t")+" SET v = 'after the kill' WHERE id = 2")
}

// doneChunks returns the run's done chunks: "table/seq" → attempts and update time.
func (d *upgradeDiff) doneChunks(runID string) map[string]string {
	out := map[string]string{}
	queryRows(d.t, d.meta, "SELECT table_idx, seq, attempts, updated_at FROM "+d.table("diff_chunks")+" WHERE run_id = ? AND state = 'done'",
		func(r *sql.Rows) error {
			var idx, seq, attempts int
			var at string
			err := r.Scan(&idx, &seq, &attempts, &at)
			out[fmt.Sprintf("%d/%d", idx, seq)] = fmt.Sprintf("attempts %d, updated %s", attempts, at)
			return err
		}, runID)
	return out
}

// resumeKilled: d.bin continues the killed run.
func (d *upgradeDiff) resumeKilled() {
	t := d.t
	p := d.start("killed-new", []string{"t", "c", "k"}, "--concurrency", "2", "--resume", d.killedID)
	if code := d.wait(p); code != 1 {
		t.Fatalf("parity diff --resume %s: exit %d, want 1 (differences)", d.killedID, code)
	}
	checkReport(t, "resuming the killed run", readDiffReport(t, p.out), d.killedID, upgradeDiffWant, upgradeDiffRows)
	now := d.doneChunks(d.killedID)
	redone := 0
	for k, was := range d.killedDone {
		if now[k] != was {
			t.Errorf("chunk %s, done by the old release (%s), is now %q: compared again", k, was, now[k])
			redone++
		}
	}
	t.Logf("resumed run: %d chunks done, %d of them by the old release, %d of those compared again", len(now), len(d.killedDone), redone)
}

// resumeFinished: --resume of the finished run reports what the old release reported.
func (d *upgradeDiff) resumeFinished() {
	t := d.t
	p := d.start("finished-new", []string{"r"}, "--resume", d.finishedID)
	if code := d.wait(p); code != 1 {
		t.Fatalf("parity diff --resume %s (finished): exit %d, want 1", d.finishedID, code)
	}
	rep := readDiffReport(t, p.out)
	checkReport(t, "resuming the finished run", rep, d.finishedID, map[string][]string{"r": {"differing id=9 [v]"}}, map[string]int64{"r": 200})
	if tb := rep.table("r"); tb != nil && tb.DifferencesResolved != 1 {
		t.Errorf("resuming the finished run: %d differences resolved, the old release reported 1", tb.DifferencesResolved)
	}
}

type diffReport struct {
	RunID  string      `json:"run_id"`
	State  string      `json:"state"`
	Tables []diffTable `json:"tables"`
}

type diffTable struct {
	Table               string `json:"table"`
	RowsChecked         int64  `json:"rows_checked"`
	DifferencesTotal    int64  `json:"differences_total"`
	DifferencesResolved int64  `json:"differences_resolved"`
	Differences         []struct {
		Kind    string            `json:"kind"`
		Key     map[string]string `json:"key"`
		Columns []string          `json:"columns"`
	} `json:"differences"`
}

func (r *diffReport) table(name string) *diffTable {
	for i := range r.Tables {
		if r.Tables[i].Table == name {
			return &r.Tables[i]
		}
	}
	return nil
}

func readDiffReport(t *testing.T, dir string) diffReport {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep diffReport
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("%s/report.json: %v", dir, err)
	}
	return rep
}

// checkReport: the report is of run, done, and lists exactly the wanted differences of
// each table, with every upstream row checked.
func checkReport(t *testing.T, what string, rep diffReport, run string, want map[string][]string, rows map[string]int64) {
	t.Helper()
	if rep.RunID != run || rep.State != "done" {
		t.Errorf("%s: report of run %s in state %s, want run %s done", what, rep.RunID, rep.State, run)
	}
	if len(rep.Tables) != len(want) {
		t.Errorf("%s: %d tables reported, want %d", what, len(rep.Tables), len(want))
	}
	for name, w := range want {
		tb := rep.table(name)
		if tb == nil {
			t.Errorf("%s: table %s not reported", what, name)
			continue
		}
		var got []string
		for _, df := range tb.Differences {
			keys := make([]string, 0, len(df.Key))
			for k, v := range df.Key {
				keys = append(keys, k+"="+v)
			}
			sort.Strings(keys)
			s := df.Kind + " " + strings.Join(keys, ",")
			if len(df.Columns) > 0 {
				s += " [" + strings.Join(df.Columns, ",") + "]"
			}
			got = append(got, s)
		}
		sort.Strings(got)
		if !slices.Equal(got, w) || tb.DifferencesTotal != int64(len(w)) {
			t.Errorf("%s: table %s differences (total %d):\n  got  %q\n  want %q", what, name, tb.DifferencesTotal, got, w)
		}
		if tb.RowsChecked != rows[name] {
			t.Errorf("%s: table %s: %d rows checked, want %d (every upstream row)", what, name, tb.RowsChecked, rows[name])
		}
	}
}
