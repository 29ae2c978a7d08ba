package e2e

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/segmentio/kafka-go"
	"go.uber.org/goleak"

	"github.com/tidb-parity/parity/cdc/loadgen"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// parityBin is the binary built once by TestMain.
var parityBin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if testenv.Lookup(testenv.EnvDownstream) == "" && os.Getenv("CI") != "true" {
		return m.Run() // no test environment: every test skips; nothing to build for
	}
	dir, err := os.MkdirTemp("", "parity-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer os.RemoveAll(dir)
	parityBin = filepath.Join(dir, "parity")
	root, err := repoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cmd := exec.Command("go", "build", "-o", parityBin, "./cmd/parity")
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build parity:", err)
		return 2
	}
	code := m.Run()
	if code == 0 {
		// Everything a test started (loadgen, Kafka clients, subprocess waiters) must be
		// gone. kafka-go's Writer sends metadata requests through DefaultTransport, whose
		// idle connections nothing else closes.
		if t, ok := kafka.DefaultTransport.(*kafka.Transport); ok {
			t.CloseIdleConnections()
		}
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			return 1
		}
	}
	return code
}

// httpClient polls serve's status without keeping connections (and goroutines) alive.
var httpClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above %s", dir)
		}
		dir = parent
	}
}

// env is one test's world: an upstream database on TiDB, the database of the same name
// on the fallback, a topic, and a serve configuration.
type env struct {
	t          testing.TB // the test or benchmark
	db         string     // database name, the same on both sides
	upDSN      string     // TiDB root DSN
	downDSN    string     // fallback root DSN
	broker     string
	topic      string
	partitions int
	statusAddr string
	configPath string
	logPath    string // serve's stdout and stderr, appended by every start
	meta       string // meta schema of this test's serve
	// serveUpstream, when set, is serve's upstream.dsn (completes handle-key-only events).
	serveUpstream string
	// timeZone is serve's changefeed.time-zone (TiCDC's --tz); "" is "+00:00".
	timeZone string
}

func newEnv(t *testing.T, partitions int, createDown bool) *env {
	t.Helper()
	up := testenv.Upstream(t)
	e := &env{
		t:          t,
		db:         up.Name,
		upDSN:      testenv.Require(t, testenv.EnvUpstream),
		downDSN:    testenv.Require(t, testenv.EnvDownstream),
		broker:     testenv.Kafka(t),
		topic:      testenv.NewTopic(t, "e2e", partitions),
		partitions: partitions,
		meta:       testenv.UniqueName("pmeta"),
	}
	down := e.open(e.downDSN, "")
	if createDown {
		if _, err := down.Exec("CREATE DATABASE " + ident.Quote(e.db)); err != nil {
			t.Fatalf("create downstream database: %v", err)
		}
	}
	t.Cleanup(func() {
		if os.Getenv("PARITY_TEST_KEEP") == "1" {
			return
		}
		_, _ = down.Exec("DROP DATABASE IF EXISTS " + ident.Quote(e.db))
		_, _ = down.Exec("DROP DATABASE IF EXISTS " + ident.Quote(e.meta))
	})
	e.keepLogOnFailure()
	e.statusAddr = freeAddr(t)
	dir := t.TempDir()
	e.configPath = filepath.Join(dir, "parity.toml")
	e.logPath = filepath.Join(dir, "serve.log")
	e.writeConfig("", "")
	return e
}

// newReplayEnv is an environment for replaying recorded changefeed records: a fresh
// topic, changefeed id and meta schema, and no database of its own on either side (the
// records' DDL create the downstream schemas; the test drops them).
func newReplayEnv(t *testing.T, partitions int, timeZone string) *env {
	t.Helper()
	e := &env{
		t:          t,
		downDSN:    testenv.Require(t, testenv.EnvDownstream),
		broker:     testenv.Kafka(t),
		topic:      testenv.NewTopic(t, "replay", partitions),
		partitions: partitions,
		meta:       testenv.UniqueName("pmeta"),
		timeZone:   timeZone,
	}
	down := e.open(e.downDSN, "")
	t.Cleanup(func() {
		if os.Getenv("PARITY_TEST_KEEP") != "1" {
			_, _ = down.Exec("DROP DATABASE IF EXISTS " + ident.Quote(e.meta))
		}
	})
	e.keepLogOnFailure()
	e.statusAddr = freeAddr(t)
	dir := t.TempDir()
	e.configPath = filepath.Join(dir, "parity.toml")
	e.logPath = filepath.Join(dir, "serve.log")
	e.writeConfig("", "")
	return e
}

// keepLogOnFailure copies serve's log out of the test's temp dir when the test fails.
func (e *env) keepLogOnFailure() {
	t := e.t
	t.Cleanup(func() {
		if t.Failed() {
			if b, err := os.ReadFile(e.logPath); err == nil {
				keep := filepath.Join(os.TempDir(), "parity-e2e-"+strings.ReplaceAll(t.Name(), "/", "_")+"-serve.log")
				if os.WriteFile(keep, b, 0o644) == nil {
					t.Logf("parity serve log kept at %s", keep)
				}
			}
		}
	})
}

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// writeConfig writes the serve config; the extras are appended to the [changefeed] and
// [applier] sections.
func (e *env) writeConfig(extraChangefeed, extraApplier string) {
	e.t.Helper()
	cfg := e.configTOML(filepath.Join(e.t.TempDir(), "spill"), "info", extraChangefeed, extraApplier, "")
	if err := os.WriteFile(e.configPath, []byte(cfg), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

// configTOML renders the serve config of this environment (tests and benchmarks); the
// extras are lines appended to the [changefeed], [applier] and [status] sections.
func (e *env) configTOML(spillDir, logLevel, extraChangefeed, extraApplier, extraStatus string) string {
	upstream := ""
	if e.serveUpstream != "" {
		upstream = fmt.Sprintf("[upstream]\ndsn = %q\n\n", e.serveUpstream)
	}
	tz := e.timeZone
	if tz == "" {
		tz = "+00:00"
	}
	return fmt.Sprintf(`[changefeed]
id = %q
brokers = [%q]
topics = [%q]
time-zone = %q
%s
%s[downstream]
dsn = %q

[applier]
meta-schema = %q
spill-dir = %q
%s
[log]
level = %q

[status]
addr = %q
%s
# The gRPC API is off: tests run several daemons at once, and its default port is one.
[api]
addr = ""
`, e.meta, e.broker, e.topic, tz, extraChangefeed, upstream, e.downDSN, e.meta, spillDir, extraApplier, logLevel, e.statusAddr, extraStatus)
}

func (e *env) open(dsn, db string) *sql.DB {
	e.t.Helper()
	c, err := mysql.ParseDSN(dsn)
	if err != nil {
		e.t.Fatal(err)
	}
	c.DBName = db
	c.ParseTime = false
	if c.Params == nil {
		c.Params = map[string]string{}
	}
	c.Params["time_zone"] = "'+00:00'"
	sdb, err := sql.Open("mysql", c.FormatDSN())
	if err != nil {
		e.t.Fatal(err)
	}
	sdb.SetMaxOpenConns(4)
	e.t.Cleanup(func() { sdb.Close() })
	return sdb
}

// loadgenConfig returns a generator configuration for this env.
func (e *env) loadgenConfig() loadgen.Config {
	cfg := loadgen.DefaultConfig()
	cfg.Upstream = e.upDSN
	cfg.Downstream = e.downDSN
	cfg.Brokers = []string{e.broker}
	cfg.Topic = e.topic
	cfg.Database = e.db
	cfg.Tables = 3
	cfg.Workers = 4
	cfg.FlushInterval = 5 * time.Millisecond
	cfg.ResolvedInterval = 100 * time.Millisecond
	return cfg
}

// serve is a running `parity serve` subprocess.
type serve struct {
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{} // closed when the process has exited
	err  error         // its exit error, valid after done
}

func (e *env) startServe() *serve {
	e.t.Helper()
	return e.startServeCmd(exec.Command(parityBin, "serve", "--config", e.configPath))
}

// startServeCmd starts a `parity serve` command, logging to e.logPath (appended), and
// makes sure it is killed when the test ends.
func (e *env) startServeCmd(cmd *exec.Cmd) *serve {
	e.t.Helper()
	logf, err := os.OpenFile(e.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		e.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		e.t.Fatalf("start %s: %v", cmd.Path, err)
	}
	s := &serve{cmd: cmd, log: logf, done: make(chan struct{})}
	go func() {
		s.err = cmd.Wait()
		logf.Close()
		close(s.done)
	}()
	e.t.Cleanup(s.kill)
	return s
}

// kill sends SIGKILL and waits for the process to be gone.
func (s *serve) kill() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
}

// stop sends SIGTERM and waits for a clean exit.
func (s *serve) stop(t testing.TB) {
	t.Helper()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
		if s.err != nil {
			t.Errorf("parity serve exited with %v after SIGTERM", s.err)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("parity serve did not exit within 30s of SIGTERM")
		s.kill()
	}
}

// exited reports the exit error if the process has ended.
func (s *serve) exited() (bool, error) {
	select {
	case <-s.done:
		return true, s.err
	default:
		return false, nil
	}
}

// status is the part of serve's /status this test reads.
type status struct {
	State      string  `json:"state"`
	Error      string  `json:"error"`
	AppliedTs  uint64  `json:"applied_ts"`
	ResolvedTs uint64  `json:"resolved_ts"`
	AppliedLag float64 `json:"applied_lag_seconds"`
	Rows       int64   `json:"rows_applied"`
	Fetched    int64   `json:"rows_fetched_upstream"`
	Loads      int64   `json:"load_statements"`
	LoadBacks  int64   `json:"load_fallbacks"`
	Partitions []struct {
		Partition  int   `json:"partition"`
		NextOffset int64 `json:"next_offset"`
	} `json:"partitions"`
}

func (e *env) status(ctx context.Context) (status, error) {
	return e.statusVia(ctx, httpClient)
}

// statusVia is status over client.
func (e *env) statusVia(ctx context.Context, client *http.Client) (status, error) {
	var st status
	err := getJSON(ctx, client, "http://"+e.statusAddr+"/status", &st)
	return st, err
}

// getJSON decodes the JSON body of a GET of url over client into v. It reads the whole
// body, so a kept-alive connection can serve the next request.
func getJSON(ctx context.Context, client *http.Client, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return json.Unmarshal(body, v)
}

// waitApplied waits until serve's applied checkpoint reaches ts.
func (e *env) waitApplied(s *serve, ts uint64, timeout time.Duration) {
	e.t.Helper()
	e.waitAppliedVia(httpClient, s, ts, timeout)
}

// waitAppliedVia is waitApplied polling /status over client.
func (e *env) waitAppliedVia(client *http.Client, s *serve, ts uint64, timeout time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	var last status
	for time.Now().Before(deadline) {
		if done, err := s.exited(); done {
			e.t.Fatalf("parity serve exited (%v) before applying ts %d; log:\n%s", err, ts, e.serveLog())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := e.statusVia(ctx, client)
		cancel()
		if err == nil {
			last = st
			if st.State == "failed" {
				e.t.Fatalf("parity serve failed: %s; log:\n%s", st.Error, e.serveLog())
			}
			if st.AppliedTs >= ts {
				return
			}
		}
		time.Sleep(20 * time.Millisecond) // fine-grained: the benchmarks time the apply up to this return
	}
	e.t.Fatalf("applied ts did not reach %d within %v (last status %+v); log:\n%s", ts, timeout, last, e.serveLog())
}

func (e *env) serveLog() string {
	b, _ := os.ReadFile(e.logPath)
	if len(b) > 8000 {
		b = b[len(b)-8000:]
	}
	return string(b)
}

// waitRead waits until serve has read every partition up to its current end.
func (e *env) waitRead(s *serve, timeout time.Duration) {
	e.t.Helper()
	ends := make([]int64, e.partitions)
	for p := range ends {
		conn, err := kafka.DialLeader(context.Background(), "tcp", e.broker, e.topic, p)
		if err != nil {
			e.t.Fatal(err)
		}
		ends[p], err = conn.ReadLastOffset()
		conn.Close()
		if err != nil {
			e.t.Fatal(err)
		}
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if done, err := s.exited(); done {
			e.t.Fatalf("parity serve exited (%v); log:\n%s", err, e.serveLog())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := e.status(ctx)
		cancel()
		if err == nil && len(st.Partitions) == e.partitions {
			caught := true
			for _, p := range st.Partitions {
				if p.NextOffset < ends[p.Partition] {
					caught = false
				}
			}
			if caught {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.t.Fatalf("parity serve did not read the partitions to %v within %v; log:\n%s", ends, timeout, e.serveLog())
}

// compareAt proves the fallback equals TiDB at ts with internal/testenv's comparator:
// the same base tables, each with the same columns, every row and every column equal.
// TiDB is read at ts; rows are matched by primary key, and keyless tables compared as
// multisets (every copy of a duplicate row counts).
func (e *env) compareAt(ts uint64) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep := testenv.AssertSame(e.t, ctx,
		testenv.Side{Label: "TiDB", DB: e.open(e.upDSN, e.db), Schema: e.db, TS: ts},
		testenv.Side{Label: "the fallback", DB: e.open(e.downDSN, e.db), Schema: e.db},
		testenv.Options{})
	if len(rep.Tables) == 0 {
		e.t.Fatalf("no tables in %s at ts %d", e.db, ts)
	}
	e.t.Logf("fallback equals TiDB at ts %d: %d tables, %d rows", ts, len(rep.Tables), rep.Rows())
}

// readRaw reads every record of every partition of the topic.
func (e *env) readRaw() [][]kafka.Message {
	e.t.Helper()
	return testenv.ReadTopic(e.t, e.broker, e.topic, e.partitions)
}

// republish writes records again, each to its own partition, in the given order.
func (e *env) republish(recs []kafka.Message) {
	e.t.Helper()
	w := &kafka.Writer{
		Addr:         kafka.TCP(e.broker),
		Topic:        e.topic,
		Balancer:     kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return m.Partition }),
		BatchTimeout: time.Millisecond,
		BatchBytes:   32 << 20,
		RequiredAcks: kafka.RequireAll,
	}
	defer w.Close()
	msgs := make([]kafka.Message, len(recs))
	for i, r := range recs {
		msgs[i] = kafka.Message{Partition: r.Partition, Key: r.Key, Value: r.Value}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := writeRetry(ctx, w, msgs); err != nil {
		e.t.Fatalf("republish %d records: %v", len(recs), err)
	}
}
