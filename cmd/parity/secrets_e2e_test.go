package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// parityProc is the parity binary (this test binary re-executed with execMainEnv) run
// by a test, its stdout and stderr captured.
type parityProc struct {
	name           string
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	done           chan struct{}
	code           int
}

// startParity starts `parity args...` with extra environment variables.
func startParity(t testing.TB, name string, env []string, args ...string) *parityProc {
	t.Helper()
	p := &parityProc{name: name, done: make(chan struct{})}
	p.cmd = exec.Command(os.Args[0], args...)
	p.cmd.Env = append(append(os.Environ(), execMainEnv+"=1"), env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		err := p.cmd.Wait()
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			p.code = ee.ExitCode()
		default:
			p.code = -1
		}
	}()
	t.Cleanup(func() { p.stop(t, 30*time.Second) })
	return p
}

// wait waits for the process to end within d (then kills it and fails).
func (p *parityProc) wait(t testing.TB, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(d):
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Fatalf("parity %s did not end within %v\nstdout:\n%s\nstderr:\n%s", p.name, d, p.stdout.String(), p.stderr.String())
		return -1
	}
}

// stop sends SIGTERM (if still running) and waits.
func (p *parityProc) stop(t testing.TB, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	return p.wait(t, d)
}

// runParity runs `parity args...` to its end (at most 3 minutes).
func runParity(t testing.TB, name string, env []string, args ...string) *parityProc {
	t.Helper()
	p := startParity(t, name, env, args...)
	p.wait(t, 3*time.Minute)
	return p
}

// randomHex returns n random bytes in hex.
func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// secretUser creates a user with password pass on the server of rootDSN, granted every
// privilege (parity reads TiDB at snapshots, writes the fallback, its meta schema and
// reads its binlog position), dropped when the test ends; it returns the user's DSN.
func secretUser(t *testing.T, rootDSN, user, pass string) string {
	t.Helper()
	db, err := sql.Open("mysql", rootDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	account := "'" + user + "'@'%'"
	for _, q := range []string{
		"CREATE USER " + account + " IDENTIFIED BY '" + pass + "'",
		"GRANT ALL PRIVILEGES ON *.* TO " + account,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", strings.ReplaceAll(q, pass, "…"), err)
		}
	}
	t.Cleanup(func() {
		if d, err := sql.Open("mysql", rootDSN); err == nil {
			_, _ = d.Exec("DROP USER IF EXISTS " + account)
			d.Close()
		}
	})
	mc, err := mysql.ParseDSN(rootDSN)
	if err != nil {
		t.Fatal(err)
	}
	mc.User, mc.Passwd = user, pass
	return mc.FormatDSN()
}

// withAddr returns dsn pointing at addr (a port nothing listens on, say).
func withAddr(t *testing.T, dsn, addr string) string {
	t.Helper()
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	mc.Addr = addr
	return mc.FormatDSN()
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return string(b)
}

// TestSecretsNeverLeak (#20 item 6): an end-to-end run against the real TiDB, fallback
// MariaDB and Kafka under dedicated users with distinctive passwords and an API token —
// `parity loadgen`, `parity serve` (verification and the gRPC API on, config file readable
// by others, log level debug), `parity status` and `parity verify` over the API (also
// with a wrong token), a divergence found, `parity diff` with a report directory,
// `parity serve --check-config`, and connections that fail (a port nothing listens on,
// a wrong password) from diff, loadgen and serve — and every output it produced (each
// process's stdout and stderr, /status, /metrics, /healthz, the report files, every
// row of both meta schemas) is searched for the passwords and tokens: none may hold
// one. The config file itself is searched too and must hold them (the search works).
func TestSecretsNeverLeak(t *testing.T) {
	upRoot := testenv.Require(t, testenv.EnvUpstream)
	down := testenv.Downstream(t)
	broker := testenv.Kafka(t)
	topic := testenv.NewTopic(t, "secrets", 2)
	db := testenv.UniqueName("secrets")
	r := randomHex(t, 6)
	upPass, downPass, wrongPass := "S3cr3t-up-"+r, "S3cr3t-down-"+r, "S3cr3t-wrong-"+r
	token, wrongToken := "T0k3n-api-"+r+"-"+randomHex(t, 8), "T0k3n-wrong-"+r+"-"+randomHex(t, 8)
	secrets := []string{upPass, downPass, wrongPass, token, wrongToken}
	upDSN := secretUser(t, upRoot, "psec_"+r, upPass)
	downDSN := secretUser(t, down.Root, "psec_"+r, downPass)
	metaSchema, diffMeta := testenv.UniqueName("pm"), testenv.UniqueName("pmd")
	t.Cleanup(func() {
		for _, dsn := range []string{upRoot, down.Root} {
			if d, err := sql.Open("mysql", dsn); err == nil {
				for _, s := range []string{db, metaSchema, diffMeta} {
					_, _ = d.Exec("DROP DATABASE IF EXISTS " + ident.Quote(s))
				}
				d.Close()
			}
		}
	})

	dir := t.TempDir()
	outputs := map[string]string{} // what an operator sees, by where it came from
	capture := func(p *parityProc) {
		outputs[p.name+" stdout"] = p.stdout.String()
		outputs[p.name+" stderr"] = p.stderr.String()
	}
	expectCode := func(p *parityProc, want int) {
		t.Helper()
		if p.code != want {
			t.Fatalf("parity %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", p.name, p.code, want, p.stdout.String(), p.stderr.String())
		}
	}

	// loadgen: tables imported into both sides, then transactions through Kafka.
	lg := runParity(t, "loadgen", nil, "loadgen", "--upstream-dsn", upDSN, "--downstream-dsn", downDSN,
		"--brokers", broker, "--topic", topic, "--database", db, "--tables", "2", "--import-rows", "300",
		"--import-ts-file", filepath.Join(dir, "import_ts"), "--workers", "2", "--rate", "100", "--duration", "3s",
		"--flush-interval", "5ms", "--resolved-interval", "100ms", "--heartbeat=false", "--log-level", "debug")
	capture(lg)
	expectCode(lg, 0)
	field := func(out, key string) uint64 {
		t.Helper()
		m := regexp.MustCompile(`(?m)^` + key + `=(\d+)$`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("loadgen printed no %s:\n%s", key, out)
		}
		v, _ := strconv.ParseUint(m[1], 10, 64)
		return v
	}
	importTs, resolvedTs := field(lg.stdout.String(), "import_ts"), field(lg.stdout.String(), "resolved_ts")

	// serve's config file, readable by others (a warning), with both passwords; the API
	// with a token file.
	tokenFile := filepath.Join(dir, "tokens.toml")
	if err := os.WriteFile(tokenFile, []byte(fmt.Sprintf("[[token]]\nname = \"secrets-test\"\nrole = \"repair\"\ntoken = %q\n", token)), 0o600); err != nil {
		t.Fatal(err)
	}
	clientToken, wrongTokenFile := filepath.Join(dir, "client-token"), filepath.Join(dir, "wrong-token")
	for path, tok := range map[string]string{clientToken: token, wrongTokenFile: wrongToken} {
		if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	statusAddr, apiAddr := freeAddr(t), freeAddr(t)
	serveToml := fmt.Sprintf(`[changefeed]
id = "secrets"
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
[log]
level = "debug"
[status]
addr = %q
[verify]
enabled = true
tables = [%q]
[api]
addr = %q
token-file = %q
`, broker, topic, importTs, upDSN, downDSN, metaSchema, filepath.Join(dir, "spill"), statusAddr, db+".*", apiAddr, tokenFile)
	serveFile := filepath.Join(dir, "parity.toml")
	if err := os.WriteFile(serveFile, []byte(serveToml), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(serveFile, 0o644); err != nil {
		t.Fatal(err)
	}

	// --check-config: the effective config, passwords redacted, and the warning.
	cc := runParity(t, "serve --check-config", nil, "serve", "--config", serveFile, "--check-config")
	capture(cc)
	expectCode(cc, 0)
	if !strings.Contains(cc.stdout.String(), "REDACTED") || !strings.Contains(cc.stdout.String(), "psec_"+r) {
		t.Fatalf("--check-config does not show the redacted DSNs:\n%s", cc.stdout.String())
	}
	if w := cc.stderr.String(); !strings.Contains(w, "warning: config file "+serveFile+" holds secrets (downstream.dsn, upstream.dsn) and is readable by its group and others (mode 0644)") {
		t.Fatalf("--check-config gave no permission warning naming the file:\n%s", w)
	}

	serve := startParity(t, "serve", nil, "serve", "--config", serveFile)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, _, err := fetchStatus(ctx, statusAddr)
		cancel()
		if err == nil && st.AppliedTs >= resolvedTs {
			break
		}
		select {
		case <-serve.done:
			t.Fatalf("serve ended (exit %d):\n%s", serve.code, serve.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not apply up to %d within 2m: %+v, %v\n%s", resolvedTs, st, err, serve.stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	api := []string{"--addr", apiAddr, "--token-file", clientToken}
	st := runParity(t, "status", nil, append([]string{"status", "--json"}, api...)...)
	capture(st)
	expectCode(st, 0)
	v1 := runParity(t, "verify", nil, append([]string{"verify", "--json", "--timeout", "2m"}, api...)...)
	capture(v1)
	expectCode(v1, 0)
	// A row only the fallback has: the next run finds it.
	if _, err := down.Exec("INSERT INTO " + ident.Table(db, "sbtest1") + " (id, k, c, pad) VALUES (900000001, 1, 'injected', 'injected')"); err != nil {
		t.Fatal(err)
	}
	v2 := runParity(t, "verify with a difference", nil, append([]string{"verify", "--json", "--timeout", "2m"}, api...)...)
	capture(v2)
	expectCode(v2, 1)
	bad := runParity(t, "status with a wrong token", nil, "status", "--addr", apiAddr, "--token-file", wrongTokenFile)
	capture(bad)
	if bad.code == 0 || !strings.Contains(bad.stderr.String(), "Unauthenticated") && !strings.Contains(bad.stderr.String(), "UNAUTHENTICATED") {
		t.Fatalf("a wrong token: exit %d\n%s", bad.code, bad.stderr.String())
	}
	outputs["/status"] = httpGet(t, "http://"+statusAddr+"/status")
	outputs["/metrics"] = httpGet(t, "http://"+statusAddr+"/metrics")
	outputs["/healthz"] = httpGet(t, "http://"+statusAddr+"/healthz")
	outputs["/verify/runs"] = httpGet(t, "http://"+statusAddr+"/verify/runs")
	if !strings.Contains(outputs["/metrics"], "parity_cdc_applied_rows_total") {
		t.Fatalf("/metrics has no applier metrics:\n%.2000s", outputs["/metrics"])
	}
	if code := serve.stop(t, time.Minute); code != 0 {
		t.Fatalf("serve after SIGTERM: exit %d\n%s", code, serve.stderr.String())
	}
	capture(serve)

	// parity diff from a config file (readable by others) with a report directory: the
	// injected row is a difference with fix SQL.
	diffFile, report := filepath.Join(dir, "diff.toml"), filepath.Join(dir, "report")
	diffToml := fmt.Sprintf("tables = [%q]\nmeta-schema = %q\noutput = %q\n[upstream]\ndsn = %q\n[downstream]\ndsn = %q\n",
		db+".*", diffMeta, report, upDSN, downDSN)
	if err := os.WriteFile(diffFile, []byte(diffToml), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(diffFile, 0o640); err != nil {
		t.Fatal(err)
	}
	d := runParity(t, "diff", nil, "diff", "--config", diffFile, "-vv")
	capture(d)
	expectCode(d, 1)
	if !strings.Contains(d.stderr.String(), "warning: config file "+diffFile+" holds secrets") {
		t.Fatalf("diff gave no permission warning:\n%s", d.stderr.String())
	}

	// Connections that fail: nothing listens, or a wrong password. The errors name
	// where they went, never the password.
	nowhere := freeAddr(t)
	f1 := runParity(t, "diff to nowhere", nil, "diff", "--config", diffFile, "--upstream", withAddr(t, upDSN, nowhere))
	capture(f1)
	expectCode(f1, 2)
	if !strings.Contains(f1.stderr.String(), nowhere) {
		t.Fatalf("the error does not name %s:\n%s", nowhere, f1.stderr.String())
	}
	mc, _ := mysql.ParseDSN(upDSN)
	mc.Passwd = wrongPass
	f2 := runParity(t, "diff with a wrong password", nil, "diff", "--config", diffFile, "--upstream", mc.FormatDSN())
	capture(f2)
	expectCode(f2, 2)
	if !strings.Contains(f2.stderr.String(), "Access denied") {
		t.Fatalf("the error does not say access was denied:\n%s", f2.stderr.String())
	}
	f3 := runParity(t, "loadgen to nowhere", nil, "loadgen", "--upstream-dsn", withAddr(t, upDSN, nowhere), "--downstream-dsn", downDSN,
		"--brokers", broker, "--topic", topic, "--database", db, "--duration", "1s", "--log-level", "debug")
	capture(f3)
	if f3.code == 0 {
		t.Fatalf("loadgen to nowhere succeeded:\n%s", f3.stderr.String())
	}
	f4 := startParity(t, "serve to nowhere", []string{envDownstreamDSN + "=" + withAddr(t, downDSN, nowhere)},
		"serve", "--config", serveFile, "--status-addr", "", "--api-addr", "", "--log-level", "debug")
	select {
	case <-f4.done:
	case <-time.After(15 * time.Second):
		f4.stop(t, 30*time.Second)
	}
	capture(f4)
	if !strings.Contains(f4.stderr.String(), nowhere) {
		t.Fatalf("serve's log does not name %s:\n%s", nowhere, f4.stderr.String())
	}

	// The report files and every row of both meta schemas.
	if err := filepath.WalkDir(report, func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		outputs["report file "+path] = string(b)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(func() []string {
		var fix []string
		for k, v := range outputs {
			if strings.HasPrefix(k, "report file ") && strings.HasSuffix(k, ".sql") {
				fix = append(fix, v)
			}
		}
		return fix
	}(), ""), "900000001") {
		t.Fatalf("no fix SQL for the injected row in %s", report)
	}
	for _, schema := range []string{metaSchema, diffMeta} {
		dumpSchema(t, down.DB, schema, outputs)
	}

	// The search works: the config files hold the secrets.
	cfgText, _ := os.ReadFile(serveFile)
	if !strings.Contains(string(cfgText), upPass) || !strings.Contains(string(cfgText), downPass) {
		t.Fatal("the search for secrets cannot find them in the config file")
	}
	names := make([]string, 0, len(outputs))
	for k := range outputs {
		names = append(names, k)
	}
	sort.Strings(names)
	total := 0
	for _, name := range names {
		total += len(outputs[name])
		for _, s := range secrets {
			if i := strings.Index(outputs[name], s); i >= 0 {
				lo, hi := max(0, i-200), min(len(outputs[name]), i+len(s)+100)
				t.Errorf("%s holds a secret: …%s…", name, outputs[name][lo:hi])
			}
		}
	}
	t.Logf("searched %d outputs (%d bytes) for %d secrets", len(names), total, len(secrets))
}

// dumpSchema adds every row of every table of schema (as text) to outputs.
func dumpSchema(t *testing.T, db *sql.DB, schema string, outputs map[string]string) {
	t.Helper()
	rows, err := db.Query("SELECT table_name FROM information_schema.tables WHERE table_schema = ?", schema)
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, n)
	}
	rows.Close()
	if len(tables) == 0 {
		t.Fatalf("meta schema %s has no tables", schema)
	}
	for _, tbl := range tables {
		rows, err := db.Query("SELECT * FROM " + ident.Table(schema, tbl))
		if err != nil {
			t.Fatal(err)
		}
		cols, _ := rows.Columns()
		var b strings.Builder
		vals := make([]sql.RawBytes, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		for rows.Next() {
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			for _, v := range vals {
				b.Write(v)
				b.WriteByte('\t')
			}
			b.WriteByte('\n')
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
		outputs["meta table "+schema+"."+tbl] = b.String()
	}
}
