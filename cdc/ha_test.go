package cdc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

func TestHAConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		edit func(*HAConfig)
		want string
	}{
		{func(c *HAConfig) {}, ""},
		{func(c *HAConfig) { c.Enabled, c.Takeover, c.RenewInterval = true, 3*time.Second, time.Second }, ""},
		{func(c *HAConfig) { c.Takeover = 2 * time.Second }, "ha.takeover: must be between 3s and 1h, got 2s"},
		{func(c *HAConfig) { c.RenewInterval = 6 * time.Second }, "ha.renew-interval: must be 0 (takeover / 5) or between 100ms and takeover / 3 (5s), got 6s"},
		{func(c *HAConfig) { c.RenewInterval = -time.Second }, "ha.renew-interval: must be 0"},
		{func(c *HAConfig) { c.Instance = strings.Repeat("x", 129) }, "ha.instance: longer than 128 bytes"},
	} {
		c := DefaultHAConfig()
		tc.edit(&c)
		err := errors.Join(c.validate()...)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", c, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: %v, want %q", c, err, tc.want)
		}
	}
	c := DefaultHAConfig()
	if c.ttl() != 10*time.Second || c.renew() != 3*time.Second || c.poll() != time.Second {
		t.Fatalf("default lease %v, renew %v, poll %v", c.ttl(), c.renew(), c.poll())
	}
}

// TestHAStandbyFenceAndTakeover runs two replicators (instances a and b) for one
// changefeed: a applies, b stands by (its Barrier refuses, it follows the checkpoint);
// the lease taken away from a makes a's next write fail its fence (nothing of the round
// lands) and a stand by; once that lease ends one of them takes over and applies the
// round exactly once; a stopped active daemon releases the lease and the other one takes
// over at its next read; ha_epochs and the checkpoint's epoch record who applied.
func TestHAStandbyFenceAndTakeover(t *testing.T) {
	down := testenv.Downstream(t)
	f := newFeed(t, 2)
	s := down.Name
	exec(t, down.DB, "CREATE TABLE kv (id BIGINT PRIMARY KEY, v VARCHAR(32))")
	exec(t, down.DB, "CREATE TABLE nk (a BIGINT, b VARCHAR(32))")
	cfg := testConfig(t, f, down)
	// Renewals far apart: the fence, not a renewal, is what finds the lease gone.
	cfg.HA = HAConfig{Enabled: true, Takeover: 6 * time.Second, RenewInterval: 2 * time.Second}
	meta := ident.Quote(cfg.Applier.MetaSchema)
	lease := func() (holder string, epoch uint64) {
		t.Helper()
		if err := down.QueryRow("SELECT holder, epoch FROM "+meta+".ha_lease WHERE changefeed='test'").Scan(&holder, &epoch); err != nil {
			t.Fatal(err)
		}
		return holder, epoch
	}
	checkpoint := func() (ts, epoch uint64) {
		t.Helper()
		if err := down.QueryRow("SELECT applied_ts, epoch FROM "+meta+".checkpoint WHERE changefeed='test'").Scan(&ts, &epoch); err != nil {
			t.Fatal(err)
		}
		return ts, epoch
	}
	waitFor := func(what string, d time.Duration, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(d)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v", what, d)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	role := func(run *running) string {
		if ha := run.r.Status().HA; ha != nil {
			return ha.Role
		}
		return ""
	}

	t1 := f.next()
	f.rows(0, ins(t1, s, "kv", ci("id", 1, pk), cs("v", "a")))
	f.rows(1, ins(t1, s, "nk", ci("a", 1, 0), cs("b", "x")))
	f.resolved(t1)
	ca, cb := cfg, cfg
	ca.HA.Instance, cb.HA.Instance = "a", "b"
	a := start(t, ca, nil)
	a.wait(t, t1)
	if h, e := lease(); h != "a" || e != 1 {
		t.Fatalf("lease %s at epoch %d, want a at 1", h, e)
	}
	if _, e := checkpoint(); e != 1 {
		t.Fatalf("checkpoint written at epoch %d, want 1", e)
	}
	b := start(t, cb, nil)
	waitFor("b stands by", 10*time.Second, func() bool {
		st := b.r.Status()
		return st.State == "standby" && st.HA != nil && st.HA.Holder == "a" && st.HA.Epoch == 1
	})
	b.wait(t, t1) // the standby follows the active daemon's checkpoint
	if err := b.r.Barrier(context.Background(), t1, func(context.Context) error { return nil }); !errors.Is(err, ErrStandby) || !errors.Is(err, ErrStopped) {
		t.Fatalf("a standby's barrier: %v", err)
	}
	if st := a.r.Status(); st.State != "running" || st.HA.Role != "active" || st.HA.Takeovers != 1 || st.HA.Instance != "a" {
		t.Fatalf("a: %+v %+v", st, st.HA)
	}

	// The lease taken from a (an intruder at epoch 2, for 60 s): a's next writes fail
	// their fence and a stands by; nothing of the round lands.
	exec(t, down.DB, "UPDATE "+meta+".ha_lease SET holder='intruder', epoch=epoch+1, expires_at=UTC_TIMESTAMP(6) + INTERVAL 60 SECOND")
	t2 := f.next()
	f.rows(0, ins(t2, s, "kv", ci("id", 2, pk), cs("v", "b")), upd(t2, s, "kv", []open.Column{ci("id", 1, pk), cs("v", "a")}, []open.Column{ci("id", 1, pk), cs("v", "a2")}))
	f.rows(1, ins(t2, s, "nk", ci("a", 2, 0), cs("b", "y")))
	f.resolved(t2)
	waitFor("a stands by after its fence failed", 10*time.Second, func() bool { return role(a) == "standby" })
	lost := a.r.Status().HA.LostReason
	if !strings.Contains(lost, "lease lost: this daemon applies at epoch 1, the lease is at epoch 2 held by intruder") ||
		!strings.Contains(lost, "applying to") {
		t.Fatalf("a's reason for standing by: %q (want a write's fence)", lost)
	}
	equal(t, "kv while the intruder holds the lease", dump(t, down.DB, s, "kv"), []string{"1|a"})
	equal(t, "nk while the intruder holds the lease", dump(t, down.DB, s, "nk"), []string{"1|x"})
	if ts, e := checkpoint(); ts != t1 || e != 1 {
		t.Fatalf("checkpoint %d at epoch %d, want %d at 1", ts, e, t1)
	}

	// The intruder's lease ends: a or b takes over (epoch 3) and applies t2 once.
	exec(t, down.DB, "UPDATE "+meta+".ha_lease SET expires_at=UTC_TIMESTAMP(6)")
	waitFor("a takeover", 10*time.Second, func() bool { _, e := lease(); return e == 3 })
	holder, _ := lease()
	active, standby := a, b
	if holder == "b" {
		active, standby = b, a
	}
	active.wait(t, t2)
	equal(t, "kv after the takeover", dump(t, down.DB, s, "kv"), []string{"1|a2", "2|b"})
	equal(t, "nk after the takeover", dump(t, down.DB, s, "nk"), []string{"1|x", "2|y"})
	if _, e := checkpoint(); e != 3 {
		t.Fatalf("checkpoint written at epoch %d, want 3", e)
	}

	// A clean stop releases the lease: the standby takes over at its next read.
	stopped := time.Now()
	if err := active.stop(t); err != nil {
		t.Fatal(err)
	}
	waitFor("the standby takes over a released lease", 3*time.Second, func() bool { return role(standby) == "active" })
	t.Logf("released lease taken over in %v", time.Since(stopped).Round(time.Millisecond))
	t3 := f.next()
	f.rows(1, ins(t3, s, "nk", ci("a", 3, 0), cs("b", "z")))
	f.resolved(t3)
	standby.wait(t, t3)
	equal(t, "nk at the end", dump(t, down.DB, s, "nk"), []string{"1|x", "2|y", "3|z"})

	rows, err := down.Query("SELECT epoch, holder, previous_holder, applied_ts FROM " + meta + ".ha_epochs WHERE changefeed='test' ORDER BY epoch")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var e, ts uint64
		var h, p string
		if err := rows.Scan(&e, &h, &p, &ts); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%d %s<-%s %t", e, h, p, ts == t1 && e == 3 || ts == t2 && e == 4 || e == 1))
	}
	other := "a"
	if holder == "a" {
		other = "b"
	}
	equal(t, "ha_epochs", got, []string{"1 a<- true", "3 " + holder + "<-intruder true", "4 " + other + "<-" + holder + " true"})
}

// cutProxy forwards TCP connections to a server until cut: then it closes every
// connection and refuses new ones, until restored.
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.setCut(true)
		p.wg.Wait()
	})
	return p
}

func (p *cutProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() { defer p.wg.Done(); _, _ = io.Copy(s, c); s.Close() }()
		go func() { defer p.wg.Done(); _, _ = io.Copy(c, s); c.Close() }()
	}
}

func (p *cutProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for _, c := range p.conns {
			c.Close()
		}
		p.conns = nil
	}
}

// TestHALostFallback: the active daemon loses the fallback (its connections cut, new
// ones refused) while the standby still reaches it: the active one stops applying once
// its lease could have expired, the standby takes over when it has and applies, and the
// old one, reconnected, stays a standby.
func TestHALostFallback(t *testing.T) {
	down := testenv.Downstream(t)
	f := newFeed(t, 1)
	s := down.Name
	exec(t, down.DB, "CREATE TABLE kv (id BIGINT PRIMARY KEY, v VARCHAR(32))")
	cfg := testConfig(t, f, down)
	cfg.HA = HAConfig{Enabled: true, Takeover: 3 * time.Second}
	mc, err := mysql.ParseDSN(cfg.Downstream.DSN)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newCutProxy(t, mc.Addr)
	ca, cb := cfg, cfg
	ca.HA.Instance, cb.HA.Instance = "a", "b"
	mc.Addr = proxy.ln.Addr().String()
	ca.Downstream.DSN = mc.FormatDSN()

	t1 := f.next()
	f.rows(0, ins(t1, s, "kv", ci("id", 1, pk), cs("v", "a")))
	f.resolved(t1)
	a := start(t, ca, nil)
	a.wait(t, t1)
	b := start(t, cb, nil)
	role := func(run *running) (string, string) {
		st := run.r.Status()
		if st.HA == nil {
			return "", ""
		}
		return st.HA.Role, st.HA.LostReason
	}
	deadline := time.Now().Add(10 * time.Second)
	for r, _ := role(b); r != "standby"; r, _ = role(b) {
		if time.Now().After(deadline) {
			t.Fatal("b does not stand by")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cut := time.Now()
	proxy.setCut(true)
	t2 := f.next()
	f.rows(0, ins(t2, s, "kv", ci("id", 2, pk), cs("v", "b")))
	f.resolved(t2)
	var aStood, bActive time.Duration
	deadline = time.Now().Add(30 * time.Second)
	for aStood == 0 || bActive == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after the cut: a stood by after %v, b active after %v", aStood, bActive)
		}
		if r, _ := role(a); r == "standby" && aStood == 0 {
			aStood = time.Since(cut)
		}
		if r, _ := role(b); r == "active" && bActive == 0 {
			bActive = time.Since(cut)
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.wait(t, t2)
	applied := time.Since(cut)
	t.Logf("fallback cut from a: a stood by after %v, b took the lease after %v and applied after %v (ha.takeover %v)",
		aStood.Round(time.Millisecond), bActive.Round(time.Millisecond), applied.Round(time.Millisecond), cfg.HA.Takeover)
	// a stops once its lease may have expired (2/3 of ha.takeover after its last
	// renewal), at about the time b may take it; its writes could not land anyway.
	if aStood > cfg.HA.Takeover {
		t.Errorf("a stood by %v after the cut, more than ha.takeover %v", aStood, cfg.HA.Takeover)
	}
	if applied > cfg.HA.Takeover+time.Second {
		t.Errorf("b applied %v after the cut, more than ha.takeover %v", applied, cfg.HA.Takeover)
	}
	if _, lost := role(a); !strings.Contains(lost, "lease lost: not renewed for") {
		t.Fatalf("a's reason: %q", lost)
	}
	equal(t, "kv", dump(t, down.DB, s, "kv"), []string{"1|a", "2|b"})
	proxy.setCut(false)
	time.Sleep(2 * cfg.HA.Takeover / 3)
	if r, _ := role(a); r != "standby" {
		t.Fatalf("a reconnected is %q", r)
	}
	if r, _ := role(b); r != "active" {
		t.Fatalf("b is %q", r)
	}
}

// TestHAWhileActive: WhileActive runs its function on the daemon holding the lease only:
// never on the standby; stopped when the lease is taken away (the daemon stands by);
// started on the daemon that takes the lease over, also after a clean stop of the
// active one (its WhileActive returns); an error of the function while active is
// WhileActive's; the end of its context ends it.
func TestHAWhileActive(t *testing.T) {
	down := testenv.Downstream(t)
	f := newFeed(t, 1)
	cfg := testConfig(t, f, down)
	cfg.HA = HAConfig{Enabled: true, Takeover: 3 * time.Second, RenewInterval: 500 * time.Millisecond}
	meta := ident.Quote(cfg.Applier.MetaSchema)
	t1 := f.next()
	f.resolved(t1)

	var mu sync.Mutex
	jobs := map[string]bool{} // running now, by daemon
	var events []string
	type watcher struct {
		cancel context.CancelFunc
		done   chan error
	}
	watch := func(name string, run *running) *watcher {
		ctx, cancel := context.WithCancel(context.Background())
		w := &watcher{cancel: cancel, done: make(chan error, 1)}
		go func() {
			w.done <- run.r.WhileActive(ctx, "test job", func(ctx context.Context) error {
				mu.Lock()
				jobs[name] = true
				events = append(events, name+" start")
				mu.Unlock()
				<-ctx.Done()
				mu.Lock()
				jobs[name] = false
				events = append(events, name+" stop")
				mu.Unlock()
				return nil
			})
		}()
		t.Cleanup(cancel)
		return w
	}
	returned := func(name string, w *watcher) error {
		t.Helper()
		select {
		case err := <-w.done:
			return err
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: WhileActive did not return within 10 s", name)
			return nil
		}
	}
	is := func(name string) bool { mu.Lock(); defer mu.Unlock(); return jobs[name] }
	waitFor := func(what string, d time.Duration, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(d)
		for !ok() {
			if time.Now().After(deadline) {
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("%s: not within %v (events %q)", what, d, events)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	role := func(run *running) string {
		if ha := run.r.Status().HA; ha != nil {
			return ha.Role
		}
		return ""
	}

	ca, cb := cfg, cfg
	ca.HA.Instance, cb.HA.Instance = "a", "b"
	a := start(t, ca, nil)
	a.wait(t, t1)
	wa := watch("a", a)
	waitFor("a runs the job", 5*time.Second, func() bool { return is("a") })
	b := start(t, cb, nil)
	wb := watch("b", b)
	waitFor("b stands by", 10*time.Second, func() bool { return role(b) == "standby" })
	time.Sleep(time.Second)
	if is("b") {
		t.Fatal("the standby runs the job")
	}

	// The lease taken from a: a stands by at its next renewal and its job stops; b
	// stays a standby while the intruder holds it.
	exec(t, down.DB, "UPDATE "+meta+".ha_lease SET holder='intruder', epoch=epoch+1, expires_at=UTC_TIMESTAMP(6) + INTERVAL 60 SECOND")
	waitFor("a's job stops when a stands by", 5*time.Second, func() bool { return !is("a") && role(a) == "standby" })
	if is("b") {
		t.Fatal("b runs the job while the intruder holds the lease")
	}
	// The intruder's lease ends: the daemon that takes it over runs the job.
	exec(t, down.DB, "UPDATE "+meta+".ha_lease SET expires_at=UTC_TIMESTAMP(6)")
	waitFor("a takeover", 5*time.Second, func() bool { return role(a) == "active" || role(b) == "active" })
	active, standby := a, b
	an, sn, aw, sw := "a", "b", wa, wb
	if role(b) == "active" {
		active, standby = b, a
		an, sn, aw, sw = "b", "a", wb, wa
	}
	waitFor(an+" runs the job after taking over", 5*time.Second, func() bool { return is(an) })
	if is(sn) {
		t.Fatalf("%s, a standby, runs the job", sn)
	}
	// A clean stop of the active daemon: its WhileActive returns, its job stopped; the
	// other takes over and runs it.
	if err := active.stop(t); err != nil {
		t.Fatal(err)
	}
	if err := returned(an, aw); err != nil || is(an) {
		t.Fatalf("%s stopped: WhileActive returned %v, job running %v", an, err, is(an))
	}
	waitFor(sn+" runs the job after the clean stop", 5*time.Second, func() bool { return is(sn) })

	// An error of a job while active is WhileActive's.
	boom := errors.New("boom")
	if err := standby.r.WhileActive(context.Background(), "failing job", func(context.Context) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("WhileActive of a failing job: %v", err)
	}
	// The end of WhileActive's context stops the job and returns.
	sw.cancel()
	if err := returned(sn, sw); err != nil || is(sn) {
		t.Fatalf("%s cancelled: WhileActive returned %v, job running %v", sn, err, is(sn))
	}
	mu.Lock()
	t.Logf("events: %q", events)
	mu.Unlock()
}

// TestStopWhileStarting: a replicator stopped while it starts (the meta schema being
// created, a lease just taken) stops cleanly — Run returns nil, as for a stop between
// rounds — with and without [ha]. (TestHAWhileActive once stopped a daemon that had just
// taken the lease and got "creating meta schema …: context canceled".)
func TestStopWhileStarting(t *testing.T) {
	down := testenv.Downstream(t)
	f := newFeed(t, 1)
	for _, ha := range []bool{false, true} {
		cfg := testConfig(t, f, down)
		cfg.HA = HAConfig{Enabled: ha, Takeover: 3 * time.Second, RenewInterval: 500 * time.Millisecond}
		for _, after := range []time.Duration{0, time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond} {
			r, err := New(cfg, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(after, cancel)
			if err := r.Run(ctx); err != nil {
				t.Errorf("ha %v, stopped after %v: Run returned %v, want nil (a clean stop)", ha, after, err)
			}
			cancel()
		}
	}
}
