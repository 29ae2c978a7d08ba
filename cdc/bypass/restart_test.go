package bypass

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/tidb-parity/parity/internal/bypasslog"
	"github.com/tidb-parity/parity/internal/testenv"
)

// privateMariaDB is a MariaDB server of one test (the shared fallback serves every test
// at once and must not be restarted): its own data directory under t.TempDir(), a free
// loopback port, ROW binlog. Kill SIGKILLs it (crash recovery at the next Start).
type privateMariaDB struct {
	t       *testing.T
	bin     string
	dir     string
	port    int
	cmd     *osexec.Cmd
	exited  chan struct{}
	rootDSN string
}

func newPrivateMariaDB(t *testing.T) *privateMariaDB {
	t.Helper()
	bin, err := osexec.LookPath("mariadbd")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/mariadbd"); serr != nil {
			t.Skip("no mariadbd: scripts/env installs it")
		}
		bin = "/usr/sbin/mariadbd"
	}
	install, err := osexec.LookPath("mariadb-install-db")
	if err != nil {
		t.Skip("no mariadb-install-db: scripts/env installs it")
	}
	dir, err := os.MkdirTemp("", "pbm") // short: the socket path is bounded
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, d := range []string{"data", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := osexec.CommandContext(ctx, install, "--no-defaults", "--user="+currentUser(), "--datadir="+filepath.Join(dir, "data"),
		"--tmpdir="+filepath.Join(dir, "tmp"), "--auth-root-authentication-method=normal", "--skip-test-db").CombinedOutput()
	if err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	m := &privateMariaDB{t: t, bin: bin, dir: dir, port: port, rootDSN: fmt.Sprintf("root@tcp(127.0.0.1:%d)/", port)}
	t.Cleanup(func() { m.Kill() })
	m.Start()
	return m
}

func currentUser() string {
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	return "root"
}

// Start starts the server and waits until it answers.
func (m *privateMariaDB) Start() {
	m.t.Helper()
	m.cmd = osexec.Command(m.bin, "--no-defaults", "--user="+currentUser(), "--datadir="+filepath.Join(m.dir, "data"),
		fmt.Sprintf("--port=%d", m.port), "--bind-address=127.0.0.1", "--socket="+filepath.Join(m.dir, "s.sock"),
		"--tmpdir="+filepath.Join(m.dir, "tmp"), "--log-error="+filepath.Join(m.dir, "error.log"),
		"--server-id=77", "--log-bin="+filepath.Join(m.dir, "binlog"), "--binlog-format=ROW",
		"--innodb-buffer-pool-size=32M", "--skip-name-resolve")
	if err := m.cmd.Start(); err != nil {
		m.t.Fatalf("start mariadbd: %v", err)
	}
	m.exited = make(chan struct{})
	go func(c *osexec.Cmd, done chan struct{}) { _ = c.Wait(); close(done) }(m.cmd, m.exited)
	db, err := sql.Open("mysql", m.rootDSN)
	if err != nil {
		m.t.Fatal(err)
	}
	defer db.Close()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if err := db.Ping(); err == nil {
			return
		}
		select {
		case <-m.exited:
			log, _ := os.ReadFile(filepath.Join(m.dir, "error.log"))
			m.t.Fatalf("mariadbd exited at start:\n%s", log)
		default:
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("mariadbd on port %d not answering after a minute", m.port)
		}
	}
}

// Kill SIGKILLs the server (the process this test started) and waits for it to exit.
func (m *privateMariaDB) Kill() {
	if m.cmd == nil || m.cmd.Process == nil {
		return
	}
	_ = m.cmd.Process.Signal(syscall.SIGKILL)
	<-m.exited
	m.cmd = nil
}

// TestDetectsAcrossFallbackRestart: the fallback (a private MariaDB: the shared one must
// not be restarted) is killed with SIGKILL and started again (crash recovery) while the
// detector runs: the detector reports reconnecting, then reads on from the last whole
// transaction; a hand-written change made after the restart is detected within 5 s,
// marked (parity's) transactions before and after never are, and nothing is recorded
// twice. Then the detector itself restarts against the restarted server and resumes.
func TestDetectsAcrossFallbackRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a MariaDB server")
	}
	testenv.Require(t, testenv.EnvDownstream) // the environment (and its MariaDB) is there
	m := newPrivateMariaDB(t)
	admin, err := sql.Open("mysql", m.rootDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	for _, q := range []string{"CREATE DATABASE app", "CREATE DATABASE pm", "CREATE TABLE app.t (id INT PRIMARY KEY, v INT)"} {
		if _, err := admin.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	data := &testenv.DB{DB: admin, Name: "app"}
	meta := &testenv.DB{DB: admin, Name: "pm"}
	cfg := DefaultConfig()
	cfg.Enabled, cfg.ServerID = true, RandomServerID()
	cfg.DSN, cfg.MetaSchema, cfg.Changefeed = m.rootDSN, "pm", "cf"
	cfg.ReconnectBackoff = 200 * time.Millisecond
	r := start(t, cfg)

	markedTx(t, data, "pm", "cf", "INSERT INTO app.t VALUES (1, 0)")
	exec(t, data, "INSERT INTO app.t VALUES (2, 0)")
	want := []string{"insert id=2"}
	waitFor(t, meta, "pm", "cf", "app", "t", want)

	m.Kill()
	for deadline := time.Now().Add(30 * time.Second); r.d.Status().State != "reconnecting"; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("detector state %+v after the fallback died", r.d.Status())
		}
	}
	t.Logf("fallback killed: detector %s (%s)", r.d.Status().State, r.d.Status().LastError)
	m.Start()
	markedTx(t, data, "pm", "cf", "UPDATE app.t SET v = 1 WHERE id = 1")
	exec(t, data, "UPDATE app.t SET v = 1 WHERE id = 2")
	want = append(want, "update id=2")
	waitFor(t, meta, "pm", "cf", "app", "t", want)
	if st := r.d.Status(); st.State != "reading" {
		t.Fatalf("detector after the fallback's restart: %+v", st)
	}

	// The detector restarts too, against the restarted fallback: it resumes.
	if err := r.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	exec(t, data, "DELETE FROM app.t WHERE id = 2")
	markedTx(t, data, "pm", "cf", "DELETE FROM app.t WHERE id = 1")
	start(t, cfg)
	want = append(want, "delete id=2")
	ws := waitFor(t, meta, "pm", "cf", "app", "t", want)
	if !slices.ContainsFunc(ws, func(w bypasslog.Write) bool { return w.ServerID == 77 }) {
		t.Fatalf("detections %+v: want the fallback's server id 77", ws)
	}
}
