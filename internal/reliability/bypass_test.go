package reliability

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/cdc/bypass"
	"github.com/tidb-parity/parity/internal/bypasslog"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// serveProc is `parity serve` (the built binary) running on one configuration file.
type serveProc struct {
	t       *testing.T
	bin     string
	cfgPath string
	logPath string
	cmd     *exec.Cmd
	exited  chan error // receives Wait's error once
	starts  int
}

func (s *serveProc) start() {
	s.t.Helper()
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		s.t.Fatal(err)
	}
	cmd := exec.Command(s.bin, "serve", "--config", s.cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		s.t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { err := cmd.Wait(); logf.Close(); exited <- err }()
	s.cmd, s.exited = cmd, exited
	s.starts++
}

// ended reports whether the process has exited (and its error), without waiting.
func (s *serveProc) ended() (bool, error) {
	select {
	case err := <-s.exited:
		s.exited <- err // keep it for the next look
		return true, err
	default:
		return false, nil
	}
}

func (s *serveProc) kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	err := <-s.exited
	s.exited <- err
}

// bypassStatus is the part of /status this test reads.
type bypassStatus struct {
	AppliedTs uint64         `json:"applied_ts"`
	Bypass    *bypass.Status `json:"bypass"`
}

// TestBypassAcrossFallbackRestartUnderLoad (#20 item 4, the fallback's restart): a
// private MariaDB (ROW binlog, like the shared fallback; the shared one must not be
// restarted) is the fallback of a live `parity serve` (the built binary) with
// `[bypass] enabled = true`, applying a loadgen changefeed from the shared TiDB and
// Kafka:
//   - a hand-written INSERT, UPDATE and DELETE on the fallback are each in /status's
//     bypass section within 5 s;
//   - the MariaDB is SIGKILLed mid-apply and started again on the same data (crash
//     recovery); serve's applier retries and its detector reconnects (the test restarts
//     serve only if it exited, and logs it);
//   - another hand-written INSERT, UPDATE and DELETE are each detected within 5 s;
//   - bypass_writes then holds exactly the hand-written changes, each once: none of the
//     applier's writes (keyed and keyless tables, including those applied again after
//     the crash) is flagged;
//   - once the load stopped and its final resolved ts is applied, the fallback equals
//     TiDB except exactly the rows the hand-written changes left behind.
func TestBypassAcrossFallbackRestartUnderLoad(t *testing.T) {
	t.Parallel()
	upDSN := testenv.Require(t, testenv.EnvUpstream)
	testenv.Require(t, testenv.EnvDownstream)
	broker := testenv.Kafka(t)
	bin := buildParity(t)
	m := testenv.StartMariaDB(t)

	topic := testenv.NewTopic(t, "bypass", 3)
	l, importTs := startLoad(t, loadConfig(t, upDSN, m.DSN, broker, topic, 40, 41))
	db := l.cfg.Database
	meta := testenv.UniqueName("pm")
	status := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	var sid [4]byte
	_, _ = rand.Read(sid[:])
	serverID := 100000 + binary.LittleEndian.Uint32(sid[:])%1000000000
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "parity.toml")
	cfg := fmt.Sprintf(`[changefeed]
id = "bypass-rel"
brokers = [%q]
topics = [%q]
start-ts = %d

[upstream]
dsn = %q

[downstream]
dsn = %q

[applier]
meta-schema = %q
spill-dir = %q
workers = 4

[bypass]
enabled = true
server-id = %d
schemas = [%q]
reconnect-backoff = "200ms"

[api]
addr = ""

[log]
level = "info"

[status]
addr = %q
`, broker, topic, importTs, upDSN, m.DSN, meta, filepath.Join(dir, "spill"), serverID, db, status)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &serveProc{t: t, bin: bin, cfgPath: cfgPath, logPath: filepath.Join(dir, "serve.log")}
	t.Cleanup(func() {
		s.kill()
		if t.Failed() {
			b, _ := os.ReadFile(s.logPath)
			t.Logf("parity serve log:\n%s", tail(string(b), 8000))
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	fallback := openSchema(t, m.DSN, "")
	up := openSchema(t, upDSN, "")

	// live waits until serve has applied everything TiDB committed before the call and
	// its detector reads the binlog; it restarts serve once if it has exited.
	live := func(within time.Duration) bypassStatus {
		t.Helper()
		target := testenv.TiDBTSO(t, up)
		deadline := time.Now().Add(within)
		for {
			var st bypassStatus
			err := getJSON(status, "/status", &st)
			if err == nil && st.AppliedTs >= target && st.Bypass != nil && st.Bypass.State == "reading" {
				return st
			}
			if ended, werr := s.ended(); ended {
				if s.starts > 1 {
					t.Fatalf("parity serve exited again after its restart: %v", werr)
				}
				t.Logf("parity serve exited (%v); starting it again", werr)
				s.start()
			}
			select {
			case <-l.done:
				t.Fatalf("loadgen ended: %v", l.err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("serve not caught up to ts %d and reading the binlog within %v: %+v, %v", target, within, st, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	s.start()
	live(2 * time.Minute)
	time.Sleep(3 * time.Second) // parity's own writes under load, in the binlog

	tbl := ident.Table(db, "sbtest1")
	exec := func(q string) {
		t.Helper()
		qctx, qcancel := context.WithTimeout(ctx, 10*time.Second)
		defer qcancel()
		res, err := fallback.ExecContext(qctx, q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			t.Fatalf("%s: %d rows, %v", q, n, err)
		}
	}
	// Ids loadgen never reaches (its own stay far below): the rows' differences stay.
	const base = 50_000_000
	var want []string // "kind key" of every hand-written change, in order
	var latencies []time.Duration
	handWritten := func(kind string, id int, q string) {
		t.Helper()
		key := fmt.Sprintf("id=%d", id)
		want = append(want, kind+" "+key)
		exec(q)
		begin := time.Now()
		for {
			var st bypassStatus
			err := getJSON(status, "/status", &st)
			if err == nil && st.Bypass != nil {
				if i := slices.IndexFunc(st.Bypass.Recent, func(d bypass.Detection) bool {
					return d.Table == db+".sbtest1" && d.Kind == kind && d.Key == key
				}); i >= 0 {
					lat := time.Since(begin)
					latencies = append(latencies, lat)
					d := st.Bypass.Recent[i]
					if d.GTID == "" || d.Position == "" || d.ServerID != 77 {
						t.Errorf("detection %+v: want a GTID, a position and the fallback's server id 77", d)
					}
					t.Logf("hand-written %s %s detected in %v (GTID %s at %s)", kind, key, lat.Round(time.Millisecond), d.GTID, d.Position)
					return
				}
			}
			if time.Since(begin) > 5*time.Second {
				t.Fatalf("hand-written %s %s on %s not in /status within 5 s: %+v (%v)", kind, key, tbl, st.Bypass, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	insert := func(id int, c string) {
		handWritten(bypasslog.KindInsert, id, fmt.Sprintf("INSERT INTO %s (id, k, c, pad) VALUES (%d, 1, '%s', 'bypass')", tbl, id, c))
	}
	update := func(id int) {
		handWritten(bypasslog.KindUpdate, id, fmt.Sprintf("UPDATE %s SET c = 'bypass, updated' WHERE id = %d", tbl, id))
	}
	del := func(id int) {
		handWritten(bypasslog.KindDelete, id, fmt.Sprintf("DELETE FROM %s WHERE id = %d", tbl, id))
	}

	insert(base, "before")
	insert(base+1, "before")
	update(base + 1)
	del(base)

	// The fallback is SIGKILLed mid-apply and started again on the same data.
	time.Sleep(time.Second)
	var before bypassStatus
	if err := getJSON(status, "/status", &before); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	m.Kill(t)
	m.Start(t)
	t.Logf("mariadbd back after %v", fmtDur(time.Since(killed)))
	if !strings.Contains(m.ErrorLog(), "crash recovery") {
		t.Errorf("mariadbd's error log does not mention crash recovery")
	}
	after := live(2 * time.Minute)
	t.Logf("serve live again %v after the kill (serve started %d time(s)); applied ts %d → %d",
		fmtDur(time.Since(killed)), s.starts, before.AppliedTs, after.AppliedTs)
	// The kill hit serve while it applied: its applier retried, its detector reconnected.
	serveLog, _ := os.ReadFile(s.logPath)
	retries := strings.Count(string(serveLog), "transient downstream error, retrying")
	reconnects := strings.Count(string(serveLog), "bypass: reading the binlog failed, reconnecting")
	t.Logf("serve's log: %d applier retries, %d detector reconnects", retries, reconnects)
	if s.starts == 1 && (retries == 0 || reconnects == 0) {
		t.Errorf("serve rode through the fallback's kill without an applier retry (%d) or a detector reconnect (%d): the kill missed it", retries, reconnects)
	}
	time.Sleep(2 * time.Second) // more of parity's writes after the restart, in the binlog

	insert(base+2, "after")
	insert(base+3, "after")
	update(base + 3)
	del(base + 2)

	// The load stops; serve applies up to its final resolved ts.
	res, err := l.stop()
	if err != nil {
		t.Fatalf("loadgen: %v", err)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		var st bypassStatus
		if err := getJSON(status, "/status", &st); err == nil && st.AppliedTs >= res.ResolvedTs {
			break
		}
		if ended, err := s.ended(); ended {
			t.Fatalf("parity serve exited: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the final resolved ts %d was not applied within 2 minutes", res.ResolvedTs)
		}
	}
	time.Sleep(2 * time.Second) // the last applied transactions read by the detector
	t.Logf("loadgen: %d transactions, %d rows", res.Transactions, res.Rows)

	// bypass_writes: exactly the hand-written changes, each once, over the whole test.
	var tables []string
	rows, err := fallback.QueryContext(ctx, "SELECT DISTINCT schema_name, table_name FROM "+ident.Table(meta, bypasslog.WritesTable)+" WHERE changefeed = ?", "bypass-rel")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var sn, tn string
		if err := rows.Scan(&sn, &tn); err != nil {
			t.Fatal(err)
		}
		if sn != db || tn != "sbtest1" {
			t.Errorf("parity's own write flagged: bypass_writes has changes of %s.%s", sn, tn)
		}
		tables = append(tables, tn)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	var got []string
	for _, tn := range tables {
		ws, err := bypasslog.Read(ctx, fallback, meta, "bypass-rel", db, tn, time.Time{}, time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range ws {
			got = append(got, w.Kind+" "+w.Text)
		}
	}
	if !slices.Equal(got, want) {
		shown := got
		if len(shown) > 40 {
			shown = shown[:40]
		}
		t.Fatalf("bypass_writes holds %d changes (the first 40 here)\n%q\nwant exactly the %d hand-written changes, each once\n%q", len(got), shown, len(want), want)
	}

	// The fallback equals TiDB at the final resolved ts but for the two rows the
	// hand-written changes left (base+1 and base+3, extra on the fallback).
	cctx, ccancel := context.WithTimeout(ctx, 2*time.Minute)
	defer ccancel()
	rep, err := testenv.CompareSchemas(cctx,
		testenv.Side{Label: "TiDB", DB: openSchema(t, upDSN, db), Schema: db, TS: res.ResolvedTs},
		testenv.Side{Label: "the fallback", DB: openSchema(t, m.DSN, db), Schema: db},
		testenv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var diffs []string
	for _, d := range rep.Diffs {
		diffs = append(diffs, d.Table+" "+d.Kind.String()+" "+d.Key)
	}
	wantDiffs := []string{
		fmt.Sprintf("sbtest1 extra %s", rowKey(t, fallback, db, base+1)),
		fmt.Sprintf("sbtest1 extra %s", rowKey(t, fallback, db, base+3)),
	}
	if !slices.Equal(diffs, wantDiffs) {
		for _, d := range rep.Diffs {
			t.Log(d)
		}
		t.Fatalf("the fallback against TiDB at ts %d: differences %q, want exactly %q", res.ResolvedTs, diffs, wantDiffs)
	}
	if rep.Rows() == 0 {
		t.Fatalf("nothing compared in %s", db)
	}
	t.Logf("the fallback equals TiDB at ts %d but for the hand-written rows: %d tables, %d rows", res.ResolvedTs, len(rep.Tables), rep.Rows())
	slices.Sort(latencies)
	t.Logf("detection latencies (%d hand-written changes): min %v, median %v, max %v",
		len(latencies), latencies[0].Round(time.Millisecond), latencies[len(latencies)/2].Round(time.Millisecond), latencies[len(latencies)-1].Round(time.Millisecond))
}

// rowKey is how the comparator names the key of sbtest1's row id in the fallback.
func rowKey(t *testing.T, q testenv.Querier, db string, id int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tb, err := testenv.DescribeTable(ctx, q, db, "sbtest1")
	if err != nil {
		t.Fatal(err)
	}
	rows, err := testenv.ReadRows(ctx, q, tb)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if k := tb.KeyOf(r); strings.Contains(k, strconv.Itoa(id)) {
			return k
		}
	}
	t.Fatalf("no row %d in %s.sbtest1 on the fallback", id, db)
	return ""
}
