package verify

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/internal/metaschema"
	"github.com/tidb-parity/parity/internal/retry"
	"github.com/tidb-parity/parity/internal/tso"
)

// The tests here run two services — two daemons, "daemon-a" and "daemon-b" — on one
// meta schema and one changefeed, as an active and a standby parity serve on one
// fallback do, and check from the history and the claims that each schedule fire ran
// once.

// runUntilStopped runs s until the returned stop is called (or the test ends).
func runUntilStopped(t *testing.T, s *Service) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	t.Cleanup(stop)
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-s.ready:
			return stop
		case err := <-done:
			t.Fatalf("Run returned early: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the service did not start: %s", s.Stats().LastError)
		}
	}
}

// caughtUpApplier is a fallback nothing changed since the fixture wrote it, applied up to
// a second ago as a caught-up applier's would be: its watermarks follow the clock, and it
// can be held at any TSO from the fixture's on (the rows are the same at each). The
// schedule tests run for minutes; a stillApplier's TSO grows as old as the test, and its
// barriers refuse every newer TSO the service tries after a failed attempt.
type caughtUpApplier struct{ from uint64 }

func (a *caughtUpApplier) applied() uint64 { return tso.FromTime(time.Now().Add(-time.Second)) }

func (a *caughtUpApplier) Barrier(ctx context.Context, ts uint64, fn func(ctx context.Context) error) error {
	if ts < a.from {
		return fmt.Errorf("barrier at %d: the fallback is past it (%d)", ts, a.from)
	}
	for ts > a.applied() { // a TSO not applied yet: held once it is
		if err := retry.Sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
	return fn(ctx)
}

func (a *caughtUpApplier) Watermarks() (uint64, uint64) { ts := a.applied(); return ts, ts }

func (a *caughtUpApplier) WaitApplied(ctx context.Context, ts uint64) error {
	for ts > a.applied() {
		if err := retry.Sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

var _ Applier = (*caughtUpApplier)(nil)

// daemons returns services of cfg with the given instances.
func daemons(t *testing.T, f *fixture, cfg Config, instances ...string) []*Service {
	t.Helper()
	var out []*Service
	for _, inst := range instances {
		c := cfg
		c.Instance = inst
		s, err := New(c, Deps{Applier: &caughtUpApplier{from: f.ts}, Logger: testLogger(t).With("instance", inst)})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// historyDB reads the meta schema as UTC times.
func historyDB(t *testing.T, f *fixture) *sql.DB {
	t.Helper()
	mc, err := mysql.ParseDSN(f.downDSN)
	if err != nil {
		t.Fatal(err)
	}
	mc.ParseTime, mc.Loc = true, time.UTC
	if mc.Params == nil {
		mc.Params = map[string]string{}
	}
	mc.Params["time_zone"] = "'+00:00'"
	conn, err := mysql.NewConnector(mc)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	t.Cleanup(func() { db.Close() })
	return db
}

type fireRow struct {
	at            time.Time
	instance, run string
}

type runRow struct {
	id, instance, state, result, err string
	started, finished                time.Time
}

// firesAndRuns reads schedule's claims (by fire time) and its rows in verify_runs (by
// start).
func firesAndRuns(t *testing.T, f *fixture, db *sql.DB, changefeed, schedule string) ([]fireRow, []runRow) {
	t.Helper()
	rows, err := db.Query("SELECT fire_at, instance, run_id FROM "+metaschema.Table(f.meta, FiresTable)+
		" WHERE changefeed=? AND schedule=? ORDER BY fire_at", changefeed, schedule)
	if err != nil {
		t.Fatal(err)
	}
	var fires []fireRow
	for rows.Next() {
		var r fireRow
		if err := rows.Scan(&r.at, &r.instance, &r.run); err != nil {
			t.Fatal(err)
		}
		fires = append(fires, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	rows, err = db.Query("SELECT run_id, instance, state, result, COALESCE(error, ''), started_at, COALESCE(finished_at, started_at) FROM "+
		metaschema.Table(f.meta, RunsTable)+" WHERE changefeed=? AND trigger_name=? ORDER BY started_at", changefeed, schedule)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var runs []runRow
	for rows.Next() {
		var r runRow
		if err := rows.Scan(&r.id, &r.instance, &r.state, &r.result, &r.err, &r.started, &r.finished); err != nil {
			t.Fatal(err)
		}
		runs = append(runs, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return fires, runs
}

// checkOncePerFire asserts that schedule ran once per fire: every row of the history
// (a run or a skipped firing) is the claim of one fire by the daemon that recorded it,
// every fire claimed before settled has its row, no two rows start in one period (two
// daemons running a fire each would), the runs never overlap, and the fires are
// consecutive periods.
//
// stopped is when the daemons were told to stop: a run still running then ends cancelled
// (its context ended), which is not a failure of the schedule.
func checkOncePerFire(t *testing.T, fires []fireRow, runs []runRow, period time.Duration, settled, stopped time.Time) {
	t.Helper()
	byRun := map[string]fireRow{}
	for i, fr := range fires {
		byRun[fr.run] = fr
		if fr.at.Truncate(period) != fr.at {
			t.Errorf("fire at %s is not a schedule time (period %v)", fr.at, period)
		}
		if i > 0 && fr.at.Sub(fires[i-1].at) != period {
			t.Errorf("fires at %s then %s: not consecutive periods", fires[i-1].at, fr.at)
		}
	}
	recorded := map[string]bool{}
	periods := map[time.Time]string{}
	for _, r := range runs {
		// Whatever the claims say: a fire starts its run (or records its skip) within
		// the period, so two rows starting in one period are one fire run twice.
		p := r.started.Truncate(period)
		if other, dup := periods[p]; dup {
			t.Errorf("two rows for the fire of %s: %s and %s (%s)", p, other, r.id, r.instance)
		}
		periods[p] = r.id + " (" + r.instance + ")"
		fr, ok := byRun[r.id]
		if !ok {
			t.Errorf("run %s (%s, %s) has no claim of a fire", r.id, r.instance, r.state)
			continue
		}
		if fr.instance != r.instance {
			t.Errorf("run %s recorded by %s, its fire %s claimed by %s", r.id, r.instance, fr.at, fr.instance)
		}
		if r.started.Before(fr.at) || r.started.Sub(fr.at) > period/2 {
			t.Errorf("run %s started %s, its fire was %s", r.id, r.started, fr.at)
		}
		recorded[r.id] = true
		switch r.state {
		case StateDone:
			if r.result != ResultEqual {
				t.Errorf("run %s: %s %s", r.id, r.result, r.err)
			}
		case StateSkipped:
			if !strings.HasPrefix(r.err, "skipped: previous run still running") {
				t.Errorf("skipped firing %s: %s", r.id, r.err)
			}
		case StateCancelled:
			if r.finished.Before(stopped) || !strings.Contains(r.err, "context canceled") {
				t.Errorf("run %s ended %s at %s (the daemons stopped at %s): %s", r.id, r.state, r.finished, stopped, r.err)
			}
		default:
			t.Errorf("run %s ended %s: %s", r.id, r.state, r.err)
		}
	}
	for _, fr := range fires {
		if !recorded[fr.run] && fr.at.Before(settled) {
			t.Errorf("the fire at %s claimed by %s has no row in the history (run %s)", fr.at, fr.instance, fr.run)
		}
	}
	var done []runRow
	for _, r := range runs {
		if r.state == StateDone {
			done = append(done, r)
		}
	}
	sort.Slice(done, func(i, j int) bool { return done[i].started.Before(done[j].started) })
	for i := 0; i+1 < len(done); i++ {
		if done[i].finished.After(done[i+1].started) {
			t.Errorf("runs overlap: %s (%s) ran %s-%s, %s (%s) started %s", done[i].id, done[i].instance, done[i].started, done[i].finished,
				done[i+1].id, done[i+1].instance, done[i+1].started)
		}
	}
}

func instancesOf(fires []fireRow) map[string]int {
	out := map[string]int{}
	for _, fr := range fires {
		out[fr.instance]++
	}
	return out
}

// TestScheduleOncePerSecondAcrossDaemons: two daemons run a per-second schedule for
// five seconds; every fire is claimed once and recorded once, by its claimer.
func TestScheduleOncePerSecondAcrossDaemons(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 200)
	cfg := f.config()
	cfg.Schedules = []Schedule{{Name: "every-second", Cron: "* * * * * *"}}
	ss := daemons(t, f, cfg, "daemon-a", "daemon-b")
	stopA, stopB := runUntilStopped(t, ss[0]), runUntilStopped(t, ss[1])
	// Stop half-way between fires, five seconds on.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(5*time.Second + 500*time.Millisecond)))
	end := time.Now()
	stopA()
	stopB()
	fires, runs := firesAndRuns(t, f, historyDB(t, f), cfg.Changefeed, "every-second")
	if len(fires) < 4 {
		t.Fatalf("%d fires claimed in 5s", len(fires))
	}
	checkOncePerFire(t, fires, runs, time.Second, end.Add(-time.Second), end)
	if s := ss[0].Stats(); s.Instance != "daemon-a" {
		t.Errorf("Stats().Instance = %q", s.Instance)
	}
	t.Logf("%d fires (%v), %d rows", len(fires), instancesOf(fires), len(runs))
}

// TestScheduleOncePerMinuteAcrossDaemons is issue 18's "two daemons sharing the
// downstream run a one-minute schedule exactly once per minute over three minutes".
func TestScheduleOncePerMinuteAcrossDaemons(t *testing.T) {
	if testing.Short() {
		t.Skip("three minutes")
	}
	t.Parallel()
	f := newFixture(t, 500)
	cfg := f.config()
	cfg.Changefeed = "verify-test-minute"
	cfg.Schedules = []Schedule{{Name: "every-minute", Cron: "0 * * * * *"}}
	ss := daemons(t, f, cfg, "daemon-a", "daemon-b")
	stopA, stopB := runUntilStopped(t, ss[0]), runUntilStopped(t, ss[1])
	first := time.Now().Truncate(time.Minute).Add(time.Minute)
	time.Sleep(time.Until(first.Add(2*time.Minute + 20*time.Second)))
	stopped := time.Now()
	stopA()
	stopB()
	fires, runs := firesAndRuns(t, f, historyDB(t, f), cfg.Changefeed, "every-minute")
	checkOncePerFire(t, fires, runs, time.Minute, first.Add(3*time.Minute), stopped)
	if len(fires) != 3 || !fires[0].at.Equal(first.UTC()) || len(runs) != 3 {
		t.Fatalf("%d fires from %v (want 3 from %s), %d rows", len(fires), fires, first.UTC(), len(runs))
	}
	for _, r := range runs {
		if r.state != StateDone || r.result != ResultEqual {
			t.Errorf("run %s by %s: %s %s %s", r.id, r.instance, r.state, r.result, r.err)
		}
	}
	for _, fr := range fires {
		t.Logf("fire %s: %s, run %s", fr.at.Format(time.DateTime), fr.instance, fr.run)
	}
}

// TestScheduleBusyOnAnotherDaemon: a fire while the schedule's previous run is recorded
// running by another daemon that is alive (holds its instance lock) is skipped, naming
// that daemon; once that daemon is gone (its lock released, as the server does when
// its connection drops), the next fire marks its run interrupted and runs.
func TestScheduleBusyOnAnotherDaemon(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100)
	cfg := f.config()
	cfg.Changefeed = "verify-test-busy"
	cfg.Schedules = []Schedule{{Name: "every-second", Cron: "* * * * * *"}}
	s := daemons(t, f, cfg, "daemon-a")[0]
	db := historyDB(t, f)
	ctx := context.Background()
	// The other daemon: its lock, and its run left running.
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var got int
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", instanceLockName(f.meta, cfg.Changefeed, "daemon-live")).Scan(&got); err != nil || got != 1 {
		t.Fatalf("GET_LOCK: %d %v", got, err)
	}
	stop := runUntilStopped(t, s) // the meta schema is migrated once it runs
	f.exec(t, db, "INSERT INTO "+metaschema.Table(f.meta, RunsTable)+" (run_id, changefeed, trigger_kind, trigger_name, instance, scope, tables, state) "+
		"VALUES ('vlive', '"+cfg.Changefeed+"', 'schedule', 'every-second', 'daemon-live', 'full', '[]', 'running')")
	time.Sleep(2500 * time.Millisecond)
	_, runs := firesAndRuns(t, f, db, cfg.Changefeed, "every-second")
	skips := 0
	for _, r := range runs {
		switch {
		case r.id == "vlive":
		case r.state == StateSkipped && r.err == "skipped: previous run still running (vlive) on daemon daemon-live" && r.instance == "daemon-a":
			skips++
		case r.state == StateDone && r.started.Before(time.Now().Add(-2*time.Second)):
			// a run that started before the other daemon's row was inserted
		default:
			t.Fatalf("while daemon-live runs vlive: %+v", r)
		}
	}
	if skips < 1 {
		t.Fatalf("no fire skipped while daemon-live runs: %+v", runs)
	}
	// daemon-live stops: its connection, and the lock with it, are gone.
	if err := conn.Raw(func(any) error { return driver.ErrBadConn }); !errors.Is(err, driver.ErrBadConn) {
		t.Fatal(err)
	}
	conn.Close()
	time.Sleep(2500 * time.Millisecond)
	stop()
	fires, runs := firesAndRuns(t, f, db, cfg.Changefeed, "every-second")
	ranAfter := 0
	for _, r := range runs {
		if r.id == "vlive" {
			if r.state != StateFailed || r.err != "interrupted: daemon daemon-live stopped during the run" {
				t.Fatalf("the run of the stopped daemon: %+v", r)
			}
			continue
		}
		if r.state == StateDone && r.result == ResultEqual && r.instance == "daemon-a" {
			ranAfter++
		}
	}
	if ranAfter < 1 {
		t.Fatalf("no run after daemon-live stopped: %+v", runs)
	}
	if n := instancesOf(fires)["daemon-a"]; n != len(fires) || n < 4 {
		t.Fatalf("fires: %v", fires)
	}
}

// TestScheduleClaimedElsewhereIsNotMissed: a fire another daemon claimed is not a fire
// this daemon missed — the next fire it reports (parity_verify_schedule_next_run_
// timestamp_seconds, which the missed-schedule alert reads) moves on with the claims,
// not only with its own runs. It stayed at its own last run and the alert fired on
// every daemon that lost the claims.
func TestScheduleClaimedElsewhereIsNotMissed(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100)
	cfg := f.config()
	cfg.Changefeed = "verify-test-elsewhere"
	cfg.Schedules = []Schedule{{Name: "every-second", Cron: "* * * * * *"}}
	s := daemons(t, f, cfg, "daemon-b")[0]
	db := historyDB(t, f)
	stop := runUntilStopped(t, s)
	defer stop()
	// daemon-a claims the next ten fires before daemon-b can.
	first := time.Now().UTC().Truncate(time.Second).Add(time.Second)
	for i := range 10 {
		if _, err := db.Exec("INSERT INTO "+metaschema.Table(f.meta, FiresTable)+" (changefeed, schedule, fire_at, instance, run_id) VALUES (?,?,?,?,?)",
			cfg.Changefeed, "every-second", first.Add(time.Duration(i)*time.Second), "daemon-a", fmt.Sprintf("velsewhere%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Until(first.Add(3500 * time.Millisecond)))
	now := time.Now()
	st := s.Stats()
	if len(st.Schedules) != 1 {
		t.Fatalf("schedules: %+v", st.Schedules)
	}
	if next := st.Schedules[0].Next; next.Before(now.Add(-time.Second)) {
		t.Fatalf("next fire %s is %s in the past while daemon-a claims every fire: it would be reported missed", next.Format(time.RFC3339Nano), now.Sub(next))
	}
	_, runs := firesAndRuns(t, f, db, cfg.Changefeed, "every-second")
	for _, r := range runs {
		if r.started.After(first) {
			t.Fatalf("daemon-b ran a fire daemon-a claimed: %+v", r)
		}
	}
}
