package main

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
	"github.com/tidb-parity/parity/internal/bypasslog"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// bypassView is /status's bypass object, read by its documented JSON keys.
type bypassView struct {
	State      string  `json:"state"`
	Position   string  `json:"position"`
	GTID       string  `json:"gtid"`
	BinlogEnd  string  `json:"binlog_end"`
	LagSeconds float64 `json:"lag_seconds"`
	LastError  string  `json:"last_error"`
	Recent     []struct {
		Table, Kind, Key string
	} `json:"recent"`
}

// bypass reads the daemon's /status bypass object (nil while it has none).
func (e *haEnv) bypass(p *haProc) *bypassView {
	e.t.Helper()
	if _, err := e.status(p); err != nil { // fails the test when the daemon exited
		return nil
	}
	var st struct {
		Bypass *bypassView `json:"bypass"`
	}
	if err := json.Unmarshal([]byte(httpGet(e.t, "http://"+p.statusAddr+"/status")), &st); err != nil {
		e.t.Fatalf("%s /status: %v", p.name, err)
	}
	return st.Bypass
}

// binlogPos is a "file:pos" binlog position, comparable.
type binlogPos struct {
	file string
	pos  uint64
}

func parseBinlogPos(t *testing.T, s string) binlogPos {
	t.Helper()
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		t.Fatalf("binlog position %q: want file:pos", s)
	}
	pos, err := strconv.ParseUint(s[i+1:], 10, 64)
	if err != nil {
		t.Fatalf("binlog position %q: %v", s, err)
	}
	return binlogPos{s[:i], pos}
}

// atLeast reports whether p is at or after q (binlog file names sort by their number).
func (p binlogPos) atLeast(q binlogPos) bool {
	return p.file > q.file || p.file == q.file && p.pos >= q.pos
}

func (p binlogPos) String() string { return fmt.Sprintf("%s:%d", p.file, p.pos) }

// binlogEnd is the fallback's binlog end now.
func (e *haEnv) binlogEnd() binlogPos {
	e.t.Helper()
	var p binlogPos
	if err := e.down.QueryRow("SHOW MASTER STATUS").Scan(&p.file, &p.pos, new(string), new(string)); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// metricValue is the value of the sample named exactly series (name{labels}) in a
// scrape; ok is false when there is none.
func metricValue(t *testing.T, scrape, series string) (v float64, ok bool) {
	t.Helper()
	for _, line := range strings.Split(scrape, "\n") {
		if rest, found := strings.CutPrefix(line, series+" "); found {
			v, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return v, true
		}
	}
	return 0, false
}

// TestBypassUnderStandby (#33): two `parity serve` daemons of one changefeed under [ha]
// and [bypass] with one bypass.server-id, under load:
//   - only the active daemon reads the fallback's binlog: the standby's log says it waits,
//     its /status bypass.state is standby and it exports no parity_bypass_* series; no
//     daemon ever reconnects its binlog client (two clients with one server id evict
//     each other: ERROR 4052);
//   - `parity status --json` of each matches docs/reliability.md: applierState, instance
//     and ha {role, holder}; exit 0 active, 1 standby;
//   - a write that bypasses parity is detected by the active daemon, and after a
//     SIGKILL takeover by the new one, which starts reading only then: its /status
//     position follows the binlog's end while the load runs and
//     parity_bypass_lag_seconds stays below 5 s; bypass_writes holds each hand-written
//     change once;
//   - the binlog privilege revoked (and the detector's connection killed): the
//     detector cannot read, /status says reconnecting and the lag grows as time passes
//     (what ParityBypassDetectorBehind fires on: its promtool test); granted again, it
//     catches up and detects the write made meanwhile; the fallback equals TiDB at the
//     end.
func TestBypassUnderStandby(t *testing.T) {
	e, load := newHAEnv(t, 6*time.Second, haLoad)
	ctx := t.Context()

	// The daemons' own fallback user: its binlog privilege is revoked below.
	own := testenv.NewUser(t, testenv.Require(t, testenv.EnvDownstream), "pb")
	line := fmt.Sprintf("[downstream]\ndsn = %q\n", testenv.Require(t, testenv.EnvDownstream))
	if !strings.Contains(e.base, line) {
		t.Fatalf("the daemons' config has no %q:\n%s", line, e.base)
	}
	var sid [4]byte
	_, _ = rand.Read(sid[:])
	serverID := 100000 + binary.LittleEndian.Uint32(sid[:])%1000000000
	e.base = strings.Replace(e.base, line, fmt.Sprintf("[downstream]\ndsn = %q\n", own.DSN), 1) +
		fmt.Sprintf("[bypass]\nenabled = true\nserver-id = %d\nschemas = [%q]\nreconnect-backoff = \"500ms\"\n", serverID, e.db)

	reading := func(p *haProc) func() bool {
		return func() bool { b := e.bypass(p); return b != nil && b.State == "reading" }
	}
	d1 := e.start("d1")
	e.waitFor("d1 active, applying and reading the binlog", time.Minute, func() bool {
		r, _ := e.role(d1)
		_, ep := e.checkpoint()
		return r == "active" && ep == 1 && reading(d1)()
	})
	d2 := e.start("d2")
	e.waitFor("d2 stands by", 30*time.Second, func() bool { r, h := e.role(d2); return r == "standby" && h == "d1" })
	time.Sleep(3 * time.Second) // both daemons up under load, one server id

	// The standby does not read the binlog, and says so.
	if b := e.bypass(d2); b == nil || b.State != "standby" || b.Position != "" || b.BinlogEnd != "" || b.LagSeconds != 0 {
		t.Fatalf("d2's /status bypass: %+v, want state standby without a position or lag", b)
	}
	if m := httpGet(t, "http://"+d2.statusAddr+"/metrics"); strings.Contains(m, "parity_bypass_") {
		t.Fatalf("the standby exports bypass metrics:\n%s", grepLines(m, "parity_bypass_"))
	}
	if m := httpGet(t, "http://"+d1.statusAddr+"/metrics"); !strings.Contains(m, `parity_bypass_up{changefeed="ha"} 1`) {
		t.Fatalf("the active daemon's bypass metrics:\n%s", grepLines(m, "parity_bypass_"))
	}
	if !strings.Contains(d2.log(), "bypass detection waits: this daemon is a standby") {
		t.Fatalf("d2's log does not say bypass detection waits:\n%s", d2.log())
	}
	if strings.Contains(d2.log(), "bypass detection starts") {
		t.Fatalf("d2, a standby, started bypass detection:\n%s", d2.log())
	}

	// parity status --json and its human form, active and standby.
	statusCLI := func(p *haProc, wantCode int) *parityv1.Status {
		t.Helper()
		st := &parityv1.Status{}
		cliJSON(t, st, wantCode, "status", "--addr", p.apiAddr)
		return st
	}
	if st := statusCLI(d1, 0); st.GetApplierState() != parityv1.ApplierState_APPLIER_STATE_RUNNING || st.GetInstance() != "d1" ||
		st.GetHa().GetRole() != parityv1.HARole_HA_ROLE_ACTIVE || st.GetHa().GetHolder() != "d1" || st.GetHa().GetEpoch() != 1 ||
		st.GetHa().GetTakeovers() != 1 || st.GetHa().GetActiveSince() == nil {
		t.Fatalf("parity status --json of the active daemon: %v", st)
	}
	if st := statusCLI(d2, 1); st.GetApplierState() != parityv1.ApplierState_APPLIER_STATE_STANDBY || st.GetInstance() != "d2" ||
		st.GetHa().GetRole() != parityv1.HARole_HA_ROLE_STANDBY || st.GetHa().GetHolder() != "d1" || st.GetHa().GetEpoch() != 1 ||
		st.GetHa().GetLeaseExpiresIn() == nil || st.GetHa().GetActiveSince() != nil {
		t.Fatalf("parity status --json of the standby: %v", st)
	}
	// The JSON's keys are the ones docs/reliability.md names.
	_, raw, _ := runCLI(t, "status", "--addr", d2.apiAddr, "--json")
	var keys struct {
		ApplierState string `json:"applierState"`
		Instance     string `json:"instance"`
		HA           *struct {
			Role, Holder, Epoch, LeaseExpiresIn string
			Takeovers                           string
			ActiveSince                         *string
			LostReason                          string
		} `json:"ha"`
	}
	if err := json.Unmarshal([]byte(raw), &keys); err != nil || keys.ApplierState != "APPLIER_STATE_STANDBY" || keys.Instance != "d2" ||
		keys.HA == nil || keys.HA.Role != "HA_ROLE_STANDBY" || keys.HA.Holder != "d1" || keys.HA.Epoch != "1" ||
		!strings.HasSuffix(keys.HA.LeaseExpiresIn, "s") || keys.HA.Takeovers != "0" || keys.HA.ActiveSince != nil {
		t.Errorf("parity status --json of the standby (%v):\n%s", err, raw)
	}
	if code, out, _ := runCLI(t, "status", "--addr", d2.apiAddr); code != 1 || !strings.Contains(out, "applier:") ||
		!regexpMatch(`ha role:\s+standby \(follows d1, lease epoch 1 `, out) {
		t.Errorf("parity status of the standby: exit %d\n%s", code, out)
	}
	if code, out, _ := runCLI(t, "status", "--addr", d1.apiAddr); code != 0 || !regexpMatch(`ha role:\s+active \(holds the lease at epoch 1 since `, out) {
		t.Errorf("parity status of the active daemon: exit %d\n%s", code, out)
	}

	// Hand-written changes on the fallback (ids loadgen never uses), each detected by
	// the daemon reading; each undone by another, so the fallback equals TiDB at the end.
	tbl := ident.Table(e.db, "sbtest1")
	const base = 50_000_000
	var want []string
	write := func(p *haProc, kind string, id int) {
		t.Helper()
		q := fmt.Sprintf("INSERT INTO %s (id, k, c, pad) VALUES (%d, 1, 'bypass', 'bypass')", tbl, id)
		if kind == bypasslog.KindDelete {
			q = fmt.Sprintf("DELETE FROM %s WHERE id = %d", tbl, id)
		}
		if _, err := e.down.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		key := fmt.Sprintf("id=%d", id)
		want = append(want, kind+" "+key)
		if p == nil {
			return
		}
		begin := time.Now()
		e.waitFor(fmt.Sprintf("%s detects %s %s", p.name, kind, key), 10*time.Second, func() bool {
			b := e.bypass(p)
			return b != nil && slices.ContainsFunc(b.Recent, func(d struct{ Table, Kind, Key string }) bool {
				return d.Table == e.db+".sbtest1" && d.Kind == kind && d.Key == key
			})
		})
		t.Logf("%s detected %s %s in %v", p.name, kind, key, time.Since(begin).Round(time.Millisecond))
	}
	write(d1, bypasslog.KindInsert, base)
	write(d1, bypasslog.KindDelete, base)

	// d1 killed: d2 takes over and only then starts reading; d3 is the new standby.
	killed := time.Now()
	if err := d1.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-d1.done
	lease, applied := e.takeover(d2, killed, "d1 killed")
	t.Logf("d1 SIGKILLed; d2 took the lease after %v and applied after %v", lease.Round(time.Millisecond), applied.Round(time.Millisecond))
	e.waitFor("d2 reads the binlog", 10*time.Second, reading(d2))
	if !strings.Contains(d2.log(), "bypass detection starts: this daemon holds the lease") {
		t.Fatalf("d2's log does not say bypass detection started:\n%s", d2.log())
	}
	d3 := e.start("d3")
	e.waitFor("d3 stands by", 30*time.Second, func() bool { r, h := e.role(d3); return r == "standby" && h == "d2" })
	write(d2, bypasslog.KindInsert, base+1)
	write(d2, bypasslog.KindDelete, base+1)

	// The new active daemon's position follows the binlog's end under load, its lag
	// stays small.
	const lagBound = 5.0
	var lags []float64
	last := parseBinlogPos(t, e.bypass(d2).Position)
	for i := 0; i < 6; i++ {
		end := e.binlogEnd()
		var b *bypassView
		e.waitFor(fmt.Sprintf("d2's bypass position reaches the binlog's end %s", end), 3*time.Second, func() bool {
			b = e.bypass(d2)
			return b != nil && parseBinlogPos(t, b.Position).atLeast(end)
		})
		pos := parseBinlogPos(t, b.Position)
		if !pos.atLeast(last) || pos == last {
			t.Fatalf("d2's bypass position %s did not advance from %s under load", pos, last)
		}
		last = pos
		lag, ok := metricValue(t, httpGet(t, "http://"+d2.statusAddr+"/metrics"), `parity_bypass_lag_seconds{changefeed="ha"}`)
		if !ok || lag > lagBound || b.LagSeconds > lagBound {
			t.Fatalf("d2's bypass lag: metric %v (present %v), /status %v; want below %v s", lag, ok, b.LagSeconds, lagBound)
		}
		lags = append(lags, lag)
		time.Sleep(time.Second)
	}
	t.Logf("d2's bypass position followed the binlog's end to %s; lag metric %v", last, lags)

	// Nobody's binlog client was evicted: one server id, one reader.
	for _, p := range []*haProc{d1, d2, d3} {
		if l := p.log(); strings.Contains(l, "4052") || strings.Contains(l, "reading the binlog failed") {
			t.Fatalf("%s's binlog client reconnected (two readers with server id %d?):\n%s", p.name, serverID, grepLines(l, "time="))
		}
	}
	if strings.Contains(d3.log(), "bypass detection starts") || !strings.Contains(d3.log(), "bypass detection waits") {
		t.Fatalf("d3, a standby, reads the binlog:\n%s", d3.log())
	}

	// The binlog privilege revoked and the detector's connection killed: it cannot read
	// again, and its lag grows.
	if _, err := e.down.ExecContext(ctx, "REVOKE REPLICATION SLAVE ON *.* FROM "+own.Account); err != nil {
		t.Fatal(err)
	}
	dumps := queryColumn(t, e.down, "SELECT id FROM information_schema.processlist WHERE user = '"+own.Name+"' AND command LIKE 'Binlog Dump%'")
	if len(dumps) != 1 {
		t.Fatalf("%d binlog dump connections of the daemons' user, want 1 (d2's)", len(dumps))
	}
	if _, err := e.down.ExecContext(ctx, "KILL CONNECTION "+dumps[0]); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	e.waitFor("d2's detector reconnecting", 10*time.Second, func() bool { b := e.bypass(d2); return b != nil && b.State == "reconnecting" })
	write(nil, bypasslog.KindInsert, base+2) // not readable now
	lagAt := func() (float64, string) {
		m := httpGet(t, "http://"+d2.statusAddr+"/metrics")
		lag, ok := metricValue(t, m, `parity_bypass_lag_seconds{changefeed="ha"}`)
		if !ok {
			t.Fatalf("d2 exports no parity_bypass_lag_seconds:\n%s", grepLines(m, "parity_bypass_"))
		}
		up, _ := metricValue(t, m, `parity_bypass_up{changefeed="ha"}`)
		return lag, fmt.Sprint(up)
	}
	time.Sleep(2 * time.Second)
	l1, up1 := lagAt()
	time.Sleep(5 * time.Second)
	l2, up2 := lagAt()
	b := e.bypass(d2)
	t.Logf("binlog unreadable for %v: lag %.1f s then %.1f s 5 s later (parity_bypass_up %s, %s); /status %s, %q",
		time.Since(cut).Round(time.Second), l1, l2, up1, up2, b.State, b.LastError)
	if l2 < l1+4 || l2 < 6 || up2 != "0" || b.State != "reconnecting" || b.LagSeconds < l2-1 {
		t.Fatalf("a detector that cannot read: lag %.1f then %.1f s, up %s, /status %+v; want the lag growing with time", l1, l2, up2, b)
	}
	// Granted again: it reconnects, reads what it missed and catches up.
	if _, err := e.down.ExecContext(ctx, "GRANT REPLICATION SLAVE ON *.* TO "+own.Account); err != nil {
		t.Fatal(err)
	}
	granted := time.Now()
	e.waitFor("d2 detects the write made while it could not read", 45*time.Second, func() bool {
		b := e.bypass(d2)
		return b != nil && b.State == "reading" && slices.ContainsFunc(b.Recent, func(d struct{ Table, Kind, Key string }) bool {
			return d.Kind == bypasslog.KindInsert && d.Key == fmt.Sprintf("id=%d", base+2)
		})
	})
	e.waitFor("d2's bypass lag below the bound again", 15*time.Second, func() bool { l, _ := lagAt(); return l < lagBound })
	t.Logf("granted again: caught up %v later", time.Since(granted).Round(time.Millisecond))
	write(d2, bypasslog.KindDelete, base+2)

	e.finish(load)
	// Every hand-written change once, in binlog order; none of parity's own writes
	// (load, takeovers).
	all := queryColumn(t, e.down, "SELECT CONCAT(kind, ' ', key_text, ' ', table_name) FROM "+ident.Table(e.meta, bypasslog.WritesTable)+
		" WHERE changefeed = 'ha' ORDER BY binlog_file, binlog_pos, seq")
	for i := range want {
		want[i] += " sbtest1"
	}
	if !slices.Equal(all, want) {
		t.Fatalf("bypass_writes holds\n%q\nwant exactly the hand-written changes\n%q", all, want)
	}
}

func regexpMatch(pattern, s string) bool { return regexp.MustCompile(pattern).MatchString(s) }
