package testenv

// Private servers: a MariaDB, a TiDB or a Kafka broker started by one test, on free
// loopback ports with data under a temporary directory, that the test may kill, stop and
// start again (crash recovery, restarts) without touching the shared servers of
// scripts/env, which other tests use at the same time. They are started the way
// scripts/env starts the shared ones (same binaries, same essential flags), only smaller,
// and stopped (SIGKILL) and removed when the test ends.

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/segmentio/kafka-go"
)

// Ports FreePort hands out: below Linux's default ephemeral range (32768-60999), where
// the kernel takes the source ports of outgoing connections and the ports of
// Listen(":0"), and above the environment's fixed ports (scripts/env: 13306..19095 plus
// PARITY_PORT_OFFSET).
const freePortLo, freePortHi = 20000, 32000

var (
	freePortMu    sync.Mutex
	freePortGiven = map[int]bool{}
)

// FreePort returns a loopback TCP port nothing listens on at the moment of the call and
// that it has not returned before in this process. A port the kernel picked for
// Listen(":0") could come back on the next call (a private Kafka's two listeners once
// got the same one), or be taken by an outgoing connection before the server bound it
// (a private tidb-server exited at start-up): FreePort picks at random outside the
// ephemeral range instead, checks the port can be bound, and never repeats itself.
func FreePort(t testing.TB) int {
	t.Helper()
	freePortMu.Lock()
	defer freePortMu.Unlock()
	for range 1000 {
		p := freePortLo + mrand.IntN(freePortHi-freePortLo)
		if freePortGiven[p] {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		ln.Close()
		freePortGiven[p] = true
		return p
	}
	t.Fatalf("no free loopback port in %d-%d", freePortLo, freePortHi-1)
	return 0
}

// ReplaceAddr returns dsn (a go-sql-driver/mysql DSN) connecting over TCP to addr.
func ReplaceAddr(t testing.TB, dsn, addr string) string {
	t.Helper()
	c, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("parse dsn: %v", err)
	}
	c.Net, c.Addr = "tcp", addr
	return c.FormatDSN()
}

// process is one server process: started, waited for by one goroutine, killed at the
// test's end.
type process struct {
	name string
	args []string
	env  []string
	dir  string
	log  string // stdout and stderr, appended

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

func (p *process) start(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.done:
		default:
			t.Fatalf("%s: already running", p.name)
		}
	}
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(p.args[0], p.args[1:]...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = p.dir, logf, logf
	cmd.Env = append(os.Environ(), p.env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("%s: start %s: %v", p.name, p.args[0], err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}()
	p.cmd, p.done = cmd, done
}

func (p *process) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Pid returns the running process's id (0 when it is not running).
func (p *process) Pid() int {
	if !p.running() {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd.Process.Pid
}

// signal sends sig and waits up to wait for the process to exit; SIGKILL after that.
func (p *process) signal(t testing.TB, sig syscall.Signal, wait time.Duration) {
	t.Helper()
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
		return
	case <-time.After(wait):
	}
	if sig != syscall.SIGKILL {
		t.Logf("%s did not exit within %v of %v; killing it", p.name, wait, sig)
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

func (p *process) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// waitReady polls ready until it succeeds, failing the test when the process exits or
// the time is up.
func (p *process) waitReady(t testing.TB, within time.Duration, ready func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	var err error
	for {
		if err = ready(); err == nil {
			return
		}
		if !p.running() {
			t.Fatalf("%s exited during start-up: %v; its log:\n%s", p.name, err, p.tail())
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer within %v: %v; its log:\n%s", p.name, within, err, p.tail())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// shortDir returns a new directory with a short path (a unix socket path must fit in
// 108 bytes; t.TempDir's can be longer), removed when the test ends.
func shortDir(t testing.TB, prefix string) string {
	t.Helper()
	d, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if os.Getenv("PARITY_TEST_KEEP") != "1" {
			_ = os.RemoveAll(d)
		}
	})
	return d
}

func pingSQL(dsn string) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return db.PingContext(ctx)
}

func execSQL(dsn string, stmts ...string) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, s := range stmts {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// skipWithout skips (locally) or fails (CI=true) a test that needs a program.
func skipWithout(t testing.TB, what string, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s: %v", what, err)
	}
	t.Skipf("%s: %v (run `make env-up` to install it)", what, err)
}

// ---------------------------------------------------------------- MariaDB

// MariaDB is a private MariaDB server with binary logging (ROW), like the fallback of
// scripts/env.
type MariaDB struct {
	process
	Addr string // 127.0.0.1:port
	DSN  string // root over TCP, no database
}

// StartMariaDB initialises a data directory and starts mariadbd on a free port; extra
// are more server options. It is killed when the test ends.
func StartMariaDB(t testing.TB, extra ...string) *MariaDB {
	t.Helper()
	bin, err := exec.LookPath("mariadbd")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/mariadbd"); serr != nil {
			skipWithout(t, "mariadbd", err)
		}
		bin = "/usr/sbin/mariadbd"
	}
	d := shortDir(t, "pmdb")
	for _, sub := range []string{"tmp"} {
		if err := os.MkdirAll(filepath.Join(d, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	user := "root"
	if u := os.Getenv("USER"); u != "" {
		user = u
	}
	if out, err := exec.Command("mariadb-install-db", "--no-defaults", "--user="+user, "--datadir="+filepath.Join(d, "data"),
		"--tmpdir="+filepath.Join(d, "tmp"), "--auth-root-authentication-method=normal", "--skip-test-db").CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	port := FreePort(t)
	sock := filepath.Join(d, "sock")
	args := []string{bin, "--no-defaults", "--user=" + user, "--datadir=" + filepath.Join(d, "data"),
		"--port=" + strconv.Itoa(port), "--bind-address=127.0.0.1", "--socket=" + sock, "--tmpdir=" + filepath.Join(d, "tmp"),
		"--pid-file=" + filepath.Join(d, "mariadbd.pid"), "--log-error=" + filepath.Join(d, "error.log"),
		"--server-id=77", "--log-bin=" + filepath.Join(d, "binlog"), "--binlog-format=ROW",
		"--max-connections=500", "--max-allowed-packet=256M",
		"--innodb-buffer-pool-size=128M", "--innodb-log-file-size=64M",
		"--innodb-flush-log-at-trx-commit=1", "--sync-binlog=1", // crash recovery is what restart tests test
		"--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci",
		"--explicit-defaults-for-timestamp=ON", "--sql-mode=STRICT_TRANS_TABLES,NO_ENGINE_SUBSTITUTION"}
	m := &MariaDB{
		process: process{name: "private mariadbd", args: append(args, extra...), dir: d, log: filepath.Join(d, "stdout.log")},
		Addr:    net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
	}
	m.DSN = "root@tcp(" + m.Addr + ")/"
	t.Cleanup(func() { m.signal(t, syscall.SIGKILL, 0) })
	m.Start(t)
	if err := execSQL("root@unix("+sock+")/", "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'",
		"GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION"); err != nil {
		t.Fatalf("private mariadbd: %v", err)
	}
	m.process.waitReady(t, 30*time.Second, func() error { return pingSQL(m.DSN) })
	return m
}

// Start starts the server (again, after Kill or Stop: crash recovery runs then) and
// waits until it answers on its socket.
func (m *MariaDB) Start(t testing.TB) {
	t.Helper()
	m.process.start(t)
	sock := filepath.Join(m.dir, "sock")
	m.process.waitReady(t, 2*time.Minute, func() error { return pingSQL("root@unix(" + sock + ")/") })
}

// Kill kills the server with SIGKILL and waits for it to exit.
func (m *MariaDB) Kill(t testing.TB) { t.Helper(); m.signal(t, syscall.SIGKILL, 0) }

// Stop shuts the server down cleanly (SIGTERM).
func (m *MariaDB) Stop(t testing.TB) { t.Helper(); m.signal(t, syscall.SIGTERM, time.Minute) }

// ErrorLog returns the server's error log (crash recovery is reported there).
func (m *MariaDB) ErrorLog() string {
	b, _ := os.ReadFile(filepath.Join(m.dir, "error.log"))
	return string(b)
}

// ---------------------------------------------------------------- TiDB

// TiDB is a private tidb-server (unistore, data on disk) built by scripts/build-tidb.sh.
type TiDB struct {
	process
	Addr       string
	StatusAddr string
	DSN        string // root over TCP, no database
}

// repoFile returns the path of a file of the repository.
func repoFile(t testing.TB, rel string) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, rel)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no go.mod above the working directory")
		}
		dir = parent
	}
}

// StartTiDB starts a tidb-server on free ports with its store in a temporary directory.
// The binary is the one scripts/env runs (cached; built when missing, which takes
// minutes).
func StartTiDB(t testing.TB) *TiDB {
	t.Helper()
	out, err := exec.Command(repoFile(t, "scripts/build-tidb.sh")).Output()
	if err != nil {
		skipWithout(t, "tidb-server (scripts/build-tidb.sh)", err)
	}
	bin := strings.TrimSpace(string(out))
	d := shortDir(t, "ptidb")
	if err := os.MkdirAll(filepath.Join(d, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "tidb.toml"), []byte("[performance]\nmax-txn-ttl = 3600000\n[log]\nlevel = \"warn\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	port, status := FreePort(t), FreePort(t)
	db := &TiDB{
		process: process{name: "private tidb-server", dir: d, log: filepath.Join(d, "stdout.log"),
			env: []string{"TMPDIR=" + filepath.Join(d, "tmp")},
			args: []string{bin, "-config", filepath.Join(d, "tidb.toml"), "-store", "unistore", "-path", filepath.Join(d, "store"),
				"-host", "127.0.0.1", "-P", strconv.Itoa(port), "-status-host", "127.0.0.1", "-status", strconv.Itoa(status),
				"-socket", "", "-temp-dir", filepath.Join(d, "tmp"), "-log-file", filepath.Join(d, "tidb.log")}},
		Addr:       net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		StatusAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(status)),
	}
	db.DSN = "root@tcp(" + db.Addr + ")/"
	t.Cleanup(func() { db.signal(t, syscall.SIGKILL, 0) })
	db.Start(t)
	// tidb_snapshot reads need a GC safe point row, which unistore never writes.
	if err := execSQL(db.DSN, "INSERT IGNORE INTO mysql.tidb (VARIABLE_NAME,VARIABLE_VALUE,COMMENT) VALUES ('tikv_gc_safe_point','20000101-00:00:00.000 +0000','parity test')"); err != nil {
		t.Fatalf("private tidb-server: %v", err)
	}
	return db
}

// Start starts the server (again, on the same store) and waits until it answers.
func (d *TiDB) Start(t testing.TB) {
	t.Helper()
	d.process.start(t)
	d.process.waitReady(t, 3*time.Minute, func() error { return pingSQL(d.DSN) })
}

// Kill kills the server with SIGKILL and waits for it to exit.
func (d *TiDB) Kill(t testing.TB) { t.Helper(); d.signal(t, syscall.SIGKILL, 0) }

// Stop shuts the server down (SIGTERM).
func (d *TiDB) Stop(t testing.TB) { t.Helper(); d.signal(t, syscall.SIGTERM, time.Minute) }

// ---------------------------------------------------------------- Kafka

// PrivateKafka is a private single-node KRaft broker. Besides its own listener (Addr, for
// producers and admin), it has one listener per proxy passed to StartKafka, advertised
// as that proxy's address: a client bootstrapping through a proxy is told the proxy's
// address for every partition leader, so all its traffic, not only the bootstrap
// connection, goes through the proxy (a plain TCP proxy in front of a broker carries only
// the bootstrap connection: the broker advertises its own address).
type PrivateKafka struct {
	process
	Addr string // the direct listener
	// Proxies are the proxies in front of the proxied listeners, in StartKafka's order.
	Proxies []*Proxy
}

// StartKafka formats a KRaft storage directory and starts a broker on free ports, with
// proxies listeners reached through toxiproxy proxies. The jars are those scripts/env
// resolved (under $PARITY_CACHE, default ~/.cache/parity); Java must be installed.
func StartKafka(t testing.TB, proxies int) *PrivateKafka {
	t.Helper()
	cache := os.Getenv("PARITY_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "parity")
	}
	libs := filepath.Join(cache, "kafka-3.9.1", "libs")
	if _, err := os.Stat(filepath.Join(libs, ".complete")); err != nil {
		skipWithout(t, "Kafka jars (scripts/env up kafka)", err)
	}
	java, err := exec.LookPath("java")
	if err != nil {
		skipWithout(t, "java", err)
	}
	d := shortDir(t, "pkafka")
	port, ctl := FreePort(t), FreePort(t)
	k := &PrivateKafka{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	listeners := []string{"DIRECT://" + k.Addr, fmt.Sprintf("CONTROLLER://127.0.0.1:%d", ctl)}
	advertised := []string{"DIRECT://" + k.Addr}
	protocols := []string{"DIRECT:PLAINTEXT", "CONTROLLER:PLAINTEXT"}
	for i := range proxies {
		name := fmt.Sprintf("PROXIED%d", i)
		real := net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t)))
		p := NewProxy(t, fmt.Sprintf("kafka-%d", i), real)
		k.Proxies = append(k.Proxies, p)
		listeners = append(listeners, name+"://"+real)
		advertised = append(advertised, name+"://"+p.Addr)
		protocols = append(protocols, name+":PLAINTEXT")
	}
	props := fmt.Sprintf(`process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:%d
listeners=%s
advertised.listeners=%s
controller.listener.names=CONTROLLER
inter.broker.listener.name=DIRECT
listener.security.protocol.map=%s
log.dirs=%s
auto.create.topics.enable=false
num.partitions=3
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
message.max.bytes=16777216
replica.fetch.max.bytes=16777216
log.retention.hours=-1
delete.topic.enable=true
`, ctl, strings.Join(listeners, ","), strings.Join(advertised, ","), strings.Join(protocols, ","), filepath.Join(d, "data"))
	cfgPath, log4j := filepath.Join(d, "server.properties"), filepath.Join(d, "log4j.properties")
	if err := os.WriteFile(cfgPath, []byte(props), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(log4j, []byte("log4j.rootLogger=WARN, file\nlog4j.appender.file=org.apache.log4j.FileAppender\nlog4j.appender.file.File="+
		filepath.Join(d, "server.log")+"\nlog4j.appender.file.layout=org.apache.log4j.PatternLayout\nlog4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cp := filepath.Join(libs, "*")
	// A cluster id starting with '-' reads as an option to the tool's argument parser
	// (1 in 64 random ids): drawn again, as Kafka's own Uuid.randomUuid does.
	clusterID := "-"
	for strings.HasPrefix(clusterID, "-") {
		var uuid [16]byte
		_, _ = rand.Read(uuid[:])
		clusterID = base64.RawURLEncoding.EncodeToString(uuid[:])
	}
	format := exec.Command(java, "-cp", cp, "-Dlog4j.configuration=file:"+log4j, "kafka.tools.StorageTool", "format",
		"-t", clusterID, "-c", cfgPath)
	if out, err := format.CombinedOutput(); err != nil {
		t.Fatalf("kafka storage format: %v\n%s", err, out)
	}
	k.process = process{name: "private kafka", dir: d, log: filepath.Join(d, "stdout.log"),
		args: []string{java, "-Xms128m", "-Xmx384m", "-XX:+UseG1GC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
			"-Dlog4j.configuration=file:" + log4j, "-cp", cp, "kafka.Kafka", cfgPath}}
	t.Cleanup(func() { k.signal(t, syscall.SIGKILL, 0) })
	k.Start(t)
	return k
}

// Start starts the broker (again, on the same log directory) and waits until it
// answers metadata requests on its direct listener.
func (k *PrivateKafka) Start(t testing.TB) {
	t.Helper()
	k.process.start(t)
	k.process.waitReady(t, 3*time.Minute, func() error {
		conn, err := kafka.DialContext(context.Background(), "tcp", k.Addr)
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		b, err := conn.Brokers()
		if err == nil && len(b) == 0 {
			err = errors.New("no brokers in the metadata yet")
		}
		if err == nil {
			_, err = conn.Controller()
		}
		return err
	})
}

// Kill kills the broker with SIGKILL and waits for it to exit.
func (k *PrivateKafka) Kill(t testing.TB) { t.Helper(); k.signal(t, syscall.SIGKILL, 0) }

// Stop shuts the broker down cleanly (SIGTERM).
func (k *PrivateKafka) Stop(t testing.TB) { t.Helper(); k.signal(t, syscall.SIGTERM, time.Minute) }

// NewTopic creates a topic on the broker (deleted when the test ends) and waits until
// every partition has a leader that answers.
func (k *PrivateKafka) NewTopic(t testing.TB, prefix string, partitions int) string {
	t.Helper()
	return newTopicOn(t, k.Addr, prefix, partitions)
}
