package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tidb-parity/parity/api"
	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
	"github.com/tidb-parity/parity/cdc/loadgen"
	"github.com/tidb-parity/parity/daemon"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// haEnv is a changefeed under load and the `parity serve` daemons (this test binary
// re-executed as parity) configured for it with [ha].
type haEnv struct {
	t          *testing.T
	dir        string
	base       string        // the daemons' config, without [status], [api] and [ha]
	bound      time.Duration // ha.takeover
	meta       string        // the meta schema
	down       *sql.DB
	upDSN, db  string
	binlogFrom [2]string // the fallback's binlog file and position at the start
}

// haProc is one daemon.
type haProc struct {
	name, statusAddr, apiAddr string
	cmd                       *exec.Cmd
	logPath                   string
	done                      chan struct{}
}

func newHAEnv(t *testing.T, takeover time.Duration, load func(*loadgen.Config)) (*haEnv, *testLoad) {
	t.Helper()
	upDSN := testenv.Require(t, testenv.EnvUpstream)
	down := testenv.Downstream(t)
	broker := testenv.Kafka(t)
	topic := testenv.NewTopic(t, "ha", 2)
	e := &haEnv{t: t, dir: t.TempDir(), bound: takeover, meta: testenv.UniqueName("pm"), down: down.DB,
		upDSN: upDSN, db: testenv.UniqueName("ha")}
	t.Cleanup(func() { _, _ = down.Exec("DROP DATABASE IF EXISTS " + ident.Quote(e.meta)) })
	if err := down.QueryRow("SHOW MASTER STATUS").Scan(&e.binlogFrom[0], &e.binlogFrom[1], new(string), new(string)); err != nil {
		t.Fatalf("the fallback's binlog position: %v", err)
	}
	l := startLoad(t, context.Background(), upDSN, down.Root, broker, topic, e.db, load)
	e.base = fmt.Sprintf(`[changefeed]
id = "ha"
brokers = [%q]
topics = [%q]
start-ts = %d
[downstream]
dsn = %q
[applier]
meta-schema = %q
[log]
level = "info"
`, broker, topic, l.ImportTs, down.Root, e.meta)
	return e, l
}

// start starts daemon name (a fresh spill directory, status and API addresses).
func (e *haEnv) start(name string) *haProc {
	e.t.Helper()
	statusAddr, apiAddr := freeAddr(e.t), freeAddr(e.t)
	// spill-dir belongs to [applier], just before [log].
	cfg := strings.Replace(e.base, "[log]\n", fmt.Sprintf("spill-dir = %q\n[log]\n", filepath.Join(e.dir, name+"-spill")), 1) +
		fmt.Sprintf("[status]\naddr = %q\n[api]\naddr = %q\n[ha]\nenabled = true\ninstance = %q\ntakeover = %q\n",
			statusAddr, apiAddr, name, e.bound.String())
	return startDaemon(e.t, e.dir, name, statusAddr, apiAddr, cfg)
}

// startDaemon starts `parity serve` (this test binary re-executed) named name with the
// configuration cfg (written under dir), its output in dir/<name>.log; it is stopped
// (continued first, should a test have paused it) when the test ends, its log's tail
// printed when the test failed.
func startDaemon(tb testing.TB, dir, name, statusAddr, apiAddr, cfg string) *haProc {
	tb.Helper()
	p := &haProc{name: name, statusAddr: statusAddr, apiAddr: apiAddr, done: make(chan struct{}),
		logPath: filepath.Join(dir, name+".log")}
	path := filepath.Join(dir, name+".toml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		tb.Fatal(err)
	}
	logf, err := os.Create(p.logPath)
	if err != nil {
		tb.Fatal(err)
	}
	p.cmd = exec.Command(os.Args[0], "serve", "--config", path)
	p.cmd.Env = append(os.Environ(), execMainEnv+"=1")
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	tb.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if tb.Failed() {
			tb.Logf("daemon %s's log (last 3000 bytes):\n%s", p.name, tail(p.log(), 3000))
		}
	})
	return p
}

func (p *haProc) log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// status reads the daemon's /status; it fails the test when the daemon exited.
func (e *haEnv) status(p *haProc) (daemon.Status, error) {
	select {
	case <-p.done:
		e.t.Fatalf("daemon %s exited:\n%s", p.name, p.log())
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, _, err := fetchStatus(ctx, p.statusAddr)
	return st, err
}

// role is the daemon's HA role ("" while unknown).
func (e *haEnv) role(p *haProc) (role, holder string) {
	st, err := e.status(p)
	if err != nil || st.HA == nil {
		return "", ""
	}
	return st.HA.Role, st.HA.Holder
}

func (e *haEnv) waitFor(what string, d time.Duration, ok func() bool) time.Time {
	e.t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(25 * time.Millisecond)
	}
	return time.Now()
}

// checkpoint is the changefeed's checkpoint and the epoch that wrote it.
func (e *haEnv) checkpoint() (ts, epoch uint64) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := e.down.QueryRowContext(ctx, "SELECT applied_ts, epoch FROM "+ident.Quote(e.meta)+".checkpoint WHERE changefeed='ha'").Scan(&ts, &epoch)
	var me *mysql.MySQLError
	if err != nil && !errors.Is(err, sql.ErrNoRows) && !(errors.As(err, &me) && (me.Number == 1146 || me.Number == 1054)) { // being migrated
		e.t.Fatal(err)
	}
	return ts, epoch
}

// takeover waits until standby holds the lease (role active) and applied a round (the
// checkpoint carries its epoch), after the active daemon stopped at from.
func (e *haEnv) takeover(standby *haProc, from time.Time, what string) (lease, applied time.Duration) {
	e.t.Helper()
	var epoch uint64
	e.waitFor(what+": "+standby.name+" takes the lease", e.bound+20*time.Second, func() bool {
		st, err := e.status(standby)
		if err != nil || st.HA == nil || st.HA.Role != "active" {
			return false
		}
		epoch = st.HA.Epoch
		return true
	})
	lease = time.Since(from)
	e.waitFor(what+": "+standby.name+" applies", 20*time.Second, func() bool {
		_, ep := e.checkpoint()
		return ep == epoch
	})
	return lease, time.Since(from)
}

// finish stops the load, waits for the final resolved ts to be applied and compares
// TiDB at it with the fallback row by row.
func (e *haEnv) finish(l *testLoad) {
	e.t.Helper()
	res, err := l.Stop()
	if err != nil {
		e.t.Fatalf("load: %v", err)
	}
	e.waitFor("the final resolved ts applied", time.Minute, func() bool { ts, _ := e.checkpoint(); return ts >= res.ResolvedTs })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep := testenv.AssertSame(e.t, ctx,
		testenv.Side{Label: "TiDB", DB: openSchema(e.t, e.upDSN, e.db), Schema: e.db, TS: res.ResolvedTs},
		testenv.Side{Label: "the fallback", DB: openSchema(e.t, testenv.Require(e.t, testenv.EnvDownstream), e.db), Schema: e.db},
		testenv.Options{})
	if rep.Rows() == 0 {
		e.t.Fatal("nothing compared")
	}
	e.t.Logf("the fallback equals TiDB at the final resolved ts %d: %d tables, %d rows (%d transactions under load)",
		res.ResolvedTs, len(rep.Tables), rep.Rows(), res.Transactions)
}

func openSchema(t *testing.T, dsn, db string) *sql.DB {
	t.Helper()
	c, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	c.DBName = db
	if c.Params == nil {
		c.Params = map[string]string{}
	}
	c.Params["time_zone"] = "'+00:00'"
	d, err := sql.Open("mysql", c.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// epochs returns ha_epochs: "epoch holder<-previous" in epoch order, and whether the
// checkpoint each takeover started from never went back.
func (e *haEnv) epochs() []string {
	e.t.Helper()
	rows, err := e.down.Query("SELECT epoch, holder, previous_holder, applied_ts FROM " + ident.Quote(e.meta) + ".ha_epochs WHERE changefeed='ha' ORDER BY epoch")
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	var last uint64
	for rows.Next() {
		var ep, ts uint64
		var h, prev string
		if err := rows.Scan(&ep, &h, &prev, &ts); err != nil {
			e.t.Fatal(err)
		}
		if ts < last {
			e.t.Errorf("takeover at epoch %d started from checkpoint %d, below the previous takeover's %d", ep, ts, last)
		}
		last = ts
		out = append(out, fmt.Sprintf("%d %s<-%s", ep, h, prev))
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// binlogCheckpoints reads the fallback's binlog from the test's start with the server's
// own reader (mariadb-binlog, or mysqlbinlog, from the server) and returns every row
// image of the changefeed's checkpoint, in commit order: epoch and applied ts. since,
// when set, is a "file:position" to start from instead.
func (e *haEnv) binlogCheckpoints(since [2]string) (epochs, ts []uint64) {
	e.t.Helper()
	tool, err := exec.LookPath("mariadb-binlog")
	if err != nil {
		if tool, err = exec.LookPath("mysqlbinlog"); err != nil {
			e.t.Fatalf("no mariadb-binlog or mysqlbinlog to read the fallback's binlog: %v", err)
		}
	}
	c, err := mysql.ParseDSN(testenv.Require(e.t, testenv.EnvDownstream))
	if err != nil {
		e.t.Fatal(err)
	}
	host, port, _ := strings.Cut(c.Addr, ":")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, tool, "--read-from-remote-server", "--host="+host, "--port="+port, "--user="+c.User,
		"--base64-output=decode-rows", "--verbose", "--to-last-log", "--start-position="+since[1], since[0])
	cmd.Env = append(os.Environ(), "MYSQL_PWD="+c.Passwd)
	out, err := cmd.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	// Row images of `<meta>`.`checkpoint`: "### INSERT INTO" or "### UPDATE" then, after
	// SET, @1 changefeed, @2 applied_ts, @3 updated_at, @4 epoch.
	table := "`" + e.meta + "`.`checkpoint`"
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	in, set, ours := false, false, false
	var img [5]string
	flush := func() {
		if in && ours {
			ep, err1 := strconv.ParseUint(img[4], 10, 64)
			t, err2 := strconv.ParseUint(img[2], 10, 64)
			if err1 != nil || err2 != nil {
				e.t.Fatalf("checkpoint row image %q: %v %v", img, err1, err2)
			}
			epochs, ts = append(epochs, ep), append(ts, t)
		}
		in, set, ours = false, false, false
	}
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "### INSERT INTO "), strings.HasPrefix(line, "### UPDATE "), strings.HasPrefix(line, "### DELETE FROM "):
			flush()
			in = strings.HasSuffix(line, " "+table) && !strings.HasPrefix(line, "### DELETE")
			set = strings.HasPrefix(line, "### INSERT")
		case in && line == "### SET":
			set = true
		case in && line == "### WHERE":
			set = false
		case in && set && strings.HasPrefix(line, "###   @"):
			k, v, _ := strings.Cut(strings.TrimPrefix(line, "###   @"), "=")
			if i, err := strconv.Atoi(k); err == nil && i < len(img) {
				v, _, _ = strings.Cut(v, " ") // "123 /* ... */" with -vv
				img[i] = strings.Trim(v, "'")
				if i == 1 {
					ours = img[1] == "ha"
				}
			}
		case !strings.HasPrefix(line, "###"):
			flush()
		}
	}
	flush()
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		e.t.Fatalf("%s: %v\n%s", tool, err, stderr.String())
	}
	return epochs, ts
}

// oneApplierAtATime checks the binlog's checkpoint images: epochs and applied ts never
// go back (no round of an older epoch committed after a newer epoch's), and every epoch
// of want applied at least one round.
func (e *haEnv) oneApplierAtATime(since [2]string, want int) {
	e.t.Helper()
	epochs, ts := e.binlogCheckpoints(since)
	seen := map[uint64]int{}
	for i := range epochs {
		seen[epochs[i]]++
		if i > 0 && (epochs[i] < epochs[i-1] || ts[i] < ts[i-1]) {
			e.t.Fatalf("the binlog's checkpoint %d is epoch %d at ts %d after epoch %d at ts %d: two appliers at once",
				i, epochs[i], ts[i], epochs[i-1], ts[i-1])
		}
	}
	for ep := 1; ep <= want; ep++ {
		if seen[uint64(ep)] == 0 {
			e.t.Errorf("epoch %d committed no checkpoint in the binlog (%v)", ep, seen)
		}
	}
	e.t.Logf("binlog: %d checkpoint rounds, epochs in order, rounds per epoch %v", len(epochs), seen)
}

// health is the daemon's gRPC health.
func (e *haEnv) health(p *haProc) healthpb.HealthCheckResponse_ServingStatus {
	e.t.Helper()
	conn, err := grpc.NewClient(p.apiAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hr, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: api.ServiceName})
	if err != nil {
		e.t.Fatalf("%s health: %v", p.name, err)
	}
	return hr.Status
}

// apiStatus is the daemon's GetStatus over the gRPC API.
func (e *haEnv) apiStatus(p *haProc) *parityv1.Status {
	e.t.Helper()
	conn, err := grpc.NewClient(p.apiAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := parityv1.NewParityClient(conn).GetStatus(ctx, &parityv1.GetStatusRequest{})
	if err != nil {
		e.t.Fatalf("%s GetStatus: %v", p.name, err)
	}
	return st
}

func haLoad(lg *loadgen.Config) {
	lg.Tables, lg.Workers, lg.ImportRows = 3, 4, 2000
	lg.Rate, lg.RowsPerTxn = 150, 8
}

// TestStandbyTakeoverUnderLoad (#20 item 7): two daemons for one changefeed under load;
// the active one is SIGKILLed 5 times (and restarted as the new standby each time); the
// standby takes over each time within ha.takeover (the default 15 s), the fallback
// equals TiDB at the final resolved ts row by row, and the fallback's binlog shows the
// checkpoint's epochs never interleave.
func TestStandbyTakeoverUnderLoad(t *testing.T) {
	takeover := 15 * time.Second
	e, load := newHAEnv(t, takeover, haLoad)
	active := e.start("d1")
	e.waitFor("d1 active and applying", time.Minute, func() bool {
		r, _ := e.role(active)
		_, ep := e.checkpoint()
		return r == "active" && ep == 1
	})
	standby := e.start("d2")
	var took []string
	for i := 1; i <= 5; i++ {
		e.waitFor(standby.name+" stands by", 30*time.Second, func() bool {
			r, h := e.role(standby)
			return r == "standby" && h == active.name
		})
		if i == 1 {
			// Health follows the applier's state (refreshed every 500 ms).
			e.waitFor("the active daemon's health SERVING", 10*time.Second, func() bool { return e.health(active) == healthpb.HealthCheckResponse_SERVING })
			if s := e.health(standby); s != healthpb.HealthCheckResponse_NOT_SERVING {
				t.Fatalf("the standby's health: %v", s)
			}
			if st := e.apiStatus(standby); st.GetApplierState() != parityv1.ApplierState_APPLIER_STATE_STANDBY || st.GetInstance() != "d2" {
				t.Fatalf("the standby's GetStatus: %v, instance %q", st.GetApplierState(), st.GetInstance())
			}
			m := httpGet(t, "http://"+standby.statusAddr+"/metrics")
			if !strings.Contains(m, `parity_ha_active{changefeed="ha",instance="d2"} 0`) ||
				!strings.Contains(m, `parity_cdc_applier_state{changefeed="ha",state="standby"} 1`) {
				t.Fatalf("the standby's metrics:\n%s", m)
			}
			m = httpGet(t, "http://"+active.statusAddr+"/metrics")
			if !strings.Contains(m, `parity_ha_active{changefeed="ha",instance="d1"} 1`) ||
				!strings.Contains(m, `parity_ha_takeovers_total{changefeed="ha",instance="d1"} 1`) {
				t.Fatalf("the active daemon's metrics:\n%s", m)
			}
		}
		// The active daemon applies under load for a while: its checkpoint moves.
		time.Sleep(3 * time.Second)
		before, _ := e.checkpoint()
		e.waitFor(active.name+" applies", 30*time.Second, func() bool { ts, _ := e.checkpoint(); return ts > before })
		killed := time.Now()
		if err := active.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-active.done
		lease, applied := e.takeover(standby, killed, fmt.Sprintf("kill %d", i))
		took = append(took, fmt.Sprintf("%.1fs", applied.Seconds()))
		t.Logf("kill %d: %s SIGKILLed; %s took the lease after %v and applied after %v (ha.takeover %v)",
			i, active.name, standby.name, lease.Round(time.Millisecond), applied.Round(time.Millisecond), takeover)
		if applied > takeover+time.Second {
			t.Errorf("kill %d: takeover took %v, more than ha.takeover %v (+1s)", i, applied, takeover)
		}
		active, standby = standby, e.start(fmt.Sprintf("d%d", i+2))
	}
	e.waitFor(standby.name+" stands by", 30*time.Second, func() bool { r, _ := e.role(standby); return r == "standby" })
	e.finish(load)
	t.Logf("takeovers (SIGKILL to the new daemon's first checkpoint): %s", strings.Join(took, ", "))

	want := []string{"1 d1<-", "2 d2<-d1", "3 d3<-d2", "4 d4<-d3", "5 d5<-d4", "6 d6<-d5"}
	if got := e.epochs(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("ha_epochs %q, want %q", got, want)
	}
	e.oneApplierAtATime(e.binlogFrom, 6)
}

// TestStandbyFencesStaleLeader (#20 item 7): the active daemon paused (SIGSTOP) past its
// lease while applying under load; the standby takes over; the paused one, continued
// (SIGCONT), finds its lease gone at its next write or renewal and stands by: nothing it
// writes lands (no checkpoint of its epoch after the new one's, the fallback equals
// TiDB at the end).
func TestStandbyFencesStaleLeader(t *testing.T) {
	takeover := 6 * time.Second
	e, load := newHAEnv(t, takeover, haLoad)
	a := e.start("a")
	e.waitFor("a active and applying", time.Minute, func() bool {
		r, _ := e.role(a)
		_, ep := e.checkpoint()
		return r == "active" && ep == 1
	})
	b := e.start("b")
	e.waitFor("b stands by", 30*time.Second, func() bool { r, h := e.role(b); return r == "standby" && h == "a" })
	before, _ := e.checkpoint()
	e.waitFor("a applies", 30*time.Second, func() bool { ts, _ := e.checkpoint(); return ts > before })
	paused := time.Now()
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	lease, applied := e.takeover(b, paused, "a paused")
	t.Logf("a SIGSTOPped; b took the lease after %v and applied after %v (ha.takeover %v)",
		lease.Round(time.Millisecond), applied.Round(time.Millisecond), takeover)
	if applied > takeover+time.Second {
		t.Errorf("takeover took %v, more than ha.takeover %v (+1s)", applied, takeover)
	}
	time.Sleep(2 * time.Second) // b applies, a's buffered rows grow stale
	var resumeAt [2]string
	if err := e.down.QueryRow("SHOW MASTER STATUS").Scan(&resumeAt[0], &resumeAt[1], new(string), new(string)); err != nil {
		t.Fatal(err)
	}
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	continued := time.Now()
	var lost string
	e.waitFor("a stands by after SIGCONT", 30*time.Second, func() bool {
		st, err := e.status(a)
		if err != nil || st.HA == nil {
			return false
		}
		lost = st.HA.LostReason
		return st.State == "standby" && st.HA.Holder == "b" && lost != ""
	})
	t.Logf("a continued and stood by after %v: %s", time.Since(continued).Round(time.Millisecond), lost)
	if !strings.Contains(lost, "lease lost") {
		t.Fatalf("a's reason: %q", lost)
	}
	e.finish(load)
	if r, _ := e.role(a); r != "standby" {
		t.Fatalf("a is %q at the end", r)
	}
	if got := e.epochs(); strings.Join(got, ",") != "1 a<-,2 b<-a" {
		t.Fatalf("ha_epochs %q", got)
	}
	e.oneApplierAtATime(e.binlogFrom, 2)
	// Since a continued: only b's epoch in the binlog.
	epochs, _ := e.binlogCheckpoints(resumeAt)
	for _, ep := range epochs {
		if ep != 2 {
			t.Fatalf("a checkpoint of epoch %d committed after a continued (%v)", ep, epochs)
		}
	}
	if len(epochs) == 0 {
		t.Fatal("no checkpoint after a continued")
	}
	if !strings.Contains(a.log(), "lost the lease; standing by") {
		t.Fatalf("a's log:\n%s", a.log())
	}
}
