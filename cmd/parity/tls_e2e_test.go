package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/tidb-parity/parity/cdc/loadgen"
	"github.com/tidb-parity/parity/daemon"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
	"github.com/tidb-parity/parity/internal/tlsauth"
)

// tlsEnv is the TLS and SASL targets of scripts/env (fallback-tls, tidb-tls, kafka-tls)
// and the test CA's files.
type tlsEnv struct {
	ca, cert, key      string
	up, down, downPass string // DSNs: tidb-tls; fallback-tls's REQUIRE X509 and REQUIRE SSL users
	ssl, saslSSL       string
	user, password     string
}

func requireTLSEnv(t *testing.T) tlsEnv {
	dir := testenv.Require(t, testenv.EnvTLSDir)
	return tlsEnv{
		ca: filepath.Join(dir, "ca.pem"), cert: filepath.Join(dir, "client.pem"), key: filepath.Join(dir, "client-key.pem"),
		up: testenv.Require(t, testenv.EnvTLSTiDB), down: testenv.Require(t, testenv.EnvTLSMySQLX509), downPass: testenv.Require(t, testenv.EnvTLSMySQL),
		ssl: testenv.Require(t, testenv.EnvTLSKafkaSSL), saslSSL: testenv.Require(t, testenv.EnvTLSKafkaSASLSSL),
		user: testenv.Require(t, testenv.EnvTLSKafkaUser), password: testenv.Require(t, testenv.EnvTLSKafkaPassword),
	}
}

// openTLS opens dsn with t applied.
func openTLS(t *testing.T, dsn string, tl tlsauth.TLS) *sql.DB {
	t.Helper()
	d, err := tlsauth.DSN(dsn, tl, "test.tls")
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestServeAndDiffOverTLS (#20 item 5): loadgen runs a workload on TiDB over TLS and
// publishes it to kafka-tls over SASL_SSL (SCRAM-SHA-512); parity serve applies that
// changefeed to the fallback over TLS with a client certificate (a REQUIRE X509 user,
// the certificate verified under a server-name it holds) four times, each reading Kafka
// another way: SSL with a client certificate, SASL_SSL with PLAIN, SCRAM-SHA-256 and
// SCRAM-SHA-512, each into a schema of its own (changefeed.schema-map). Each copy equals
// TiDB at the final resolved ts, by the tests' own comparator and by parity diff over TLS
// on both sides. Then the refusals: diff with a server name the certificate does not
// hold, diff without the client certificate, serve with a wrong SASL password (the
// errors name the setting and hold no password).
func TestServeAndDiffOverTLS(t *testing.T) {
	e := requireTLSEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	upTLS := tlsauth.TLS{CAFile: e.ca}
	downTLS := tlsauth.TLS{CAFile: e.ca, CertFile: e.cert, KeyFile: e.key, ServerName: "parity-tls.test"}
	kafkaCA := tlsauth.TLS{CAFile: e.ca}
	kafkaCert := tlsauth.TLS{CAFile: e.ca, CertFile: e.cert, KeyFile: e.key}
	sasl := func(m string) tlsauth.SASL { return tlsauth.SASL{Mechanism: m, Username: e.user, Password: e.password} }

	up := openTLS(t, e.up, upTLS)
	down := openTLS(t, e.down, downTLS)
	db := testenv.UniqueName("tlsload")
	topic := testenv.UniqueName("tls")
	t.Cleanup(func() { _, _ = up.Exec("DROP DATABASE IF EXISTS " + ident.Quote(db)) })

	start := time.Now()
	load := startLoad(t, ctx, e.up, "", e.saslSSL, topic, db, func(c *loadgen.Config) {
		c.UpstreamTLS = upTLS
		c.KafkaTLS, c.KafkaSASL = kafkaCA, sasl(tlsauth.MechanismSCRAMSHA512)
		c.Tables, c.Workers, c.Transactions, c.Partitions = 2, 2, 150, 3
	})
	for {
		if ended, err := load.Ended(); ended {
			if err != nil {
				t.Fatalf("loadgen: %v", err)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatal("loadgen did not finish")
		}
		time.Sleep(50 * time.Millisecond)
	}
	res, _ := load.Stop()
	t.Logf("loadgen over TLS (TiDB) and SASL_SSL SCRAM-SHA-512 (Kafka): %d transactions, %d rows, resolved ts %d in %v",
		res.Transactions, res.Rows, res.ResolvedTs, time.Since(start).Round(time.Millisecond))

	for i, way := range []struct {
		name   string
		broker string
		tls    tlsauth.TLS
		sasl   tlsauth.SASL
	}{
		{"ssl-client-certificate", e.ssl, kafkaCert, tlsauth.SASL{}},
		{"sasl-plain", e.saslSSL, kafkaCA, sasl(tlsauth.MechanismPlain)},
		{"sasl-scram-sha-256", e.saslSSL, kafkaCA, sasl(tlsauth.MechanismSCRAMSHA256)},
		{"sasl-scram-sha-512", e.saslSSL, kafkaCA, sasl(tlsauth.MechanismSCRAMSHA512)},
	} {
		t.Run(way.name, func(t *testing.T) {
			target := fmt.Sprintf("%s_%d", db, i)
			t.Cleanup(func() { _, _ = down.Exec("DROP DATABASE IF EXISTS " + ident.Quote(target)) })
			cfg := tlsServeConfig(t, e, down, "tls-"+way.name, way.broker, topic)
			cfg.Changefeed.TLS, cfg.Changefeed.SASL = way.tls, way.sasl
			cfg.Changefeed.SchemaMap = map[string]string{db: target}
			cfg.Upstream.DSN, cfg.Upstream.TLS = e.up, upTLS
			cfg.Downstream.DSN, cfg.Downstream.TLS = e.down, downTLS
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			began := time.Now()
			runServeUntil(t, ctx, cfg, res.ResolvedTs)
			applied := time.Since(began)
			rep := testenv.AssertSame(t, ctx, testenv.Side{Label: "TiDB (TLS)", DB: up, Schema: db, TS: res.ResolvedTs},
				testenv.Side{Label: "the fallback (TLS)", DB: down, Schema: target}, testenv.Options{})
			if rep.Rows() == 0 {
				t.Fatal("nothing was compared")
			}

			// parity diff over TLS on both sides: the upstream verified by the CA and its
			// host, the downstream by a server name, with the client certificate.
			out := writeDiffConfig(t, e, db, target, tlsauth.TLS{})
			code, stdout, stderr := runCLI(t, "diff", "--config", out, "--snapshot", fmt.Sprint(res.ResolvedTs))
			if code != 0 || !strings.Contains(stdout, db+".sbtest1") || !strings.Contains(stdout, db+".sbtest2") {
				t.Fatalf("parity diff over TLS: exit %d, want 0 comparing sbtest1 and sbtest2\n%s\n%s", code, stdout, stderr)
			}
			t.Logf("applied through %s in %v; %d rows equal (comparator and parity diff over TLS)", way.name, applied.Round(time.Millisecond), rep.Rows())
		})
	}

	t.Run("diff refusals", func(t *testing.T) {
		target := fmt.Sprintf("%s_%d", db, 0)
		wrongName := downTLS
		wrongName.ServerName = "fallback.example.org"
		code, stdout, stderr := runCLI(t, "diff", "--config", writeDiffConfig(t, e, db, target, wrongName))
		if code != 2 || !strings.Contains(stderr, `downstream.tls.server-name: the certificate of the server at 127.0.0.1:`) ||
			!strings.Contains(stderr, `not "fallback.example.org" (as downstream.tls.server-name says)`) {
			t.Fatalf("a server name the certificate does not hold: exit %d, want 2 naming downstream.tls.server-name\n%s\n%s", code, stdout, stderr)
		}
		t.Logf("server name refused: %s", strings.TrimSpace(stderr))
		noCert := downTLS
		noCert.CertFile, noCert.KeyFile = "", ""
		code, stdout, stderr = runCLI(t, "diff", "--config", writeDiffConfig(t, e, db, target, noCert))
		if code != 2 || !strings.Contains(stderr, "Access denied for user 'parity_x509'") {
			t.Fatalf("REQUIRE X509 without a client certificate: exit %d, want 2\n%s\n%s", code, stdout, stderr)
		}
		for _, text := range []string{stdout, stderr} {
			if pw := dsnPassword(t, e.down); strings.Contains(text, pw) {
				t.Fatalf("the output holds the downstream's password:\n%s", text)
			}
		}
	})

	t.Run("wrong SASL password", func(t *testing.T) {
		const wrong = "wrong-sasl-password-7e1"
		cfg := tlsServeConfig(t, e, down, "tls-wrong-password", e.saslSSL, topic)
		cfg.Changefeed.TLS, cfg.Changefeed.SASL = kafkaCA, sasl(tlsauth.MechanismSCRAMSHA256)
		cfg.Changefeed.SASL.Password = wrong
		cfg.Downstream.DSN, cfg.Downstream.TLS = e.down, downTLS
		cfg.Log.Level = "debug"
		var logs bytes.Buffer
		err := runServeLogged(ctx, cfg, &logs)
		if err == nil {
			t.Fatal("serve started with a wrong SASL password")
		}
		want := `changefeed.sasl: the broker refused scram-sha-256 authentication as user "parity"`
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q lacks %q", err, want)
		}
		for _, text := range []string{err.Error(), logs.String()} {
			for _, secret := range []string{wrong, e.password} {
				if strings.Contains(text, secret) {
					t.Fatalf("a password is in the error or the log:\n%s", text)
				}
			}
		}
		t.Logf("refused: %v", err)
	})
}

// tlsServeConfig is serve's config for a TLS test: changefeed id reading topic from
// broker into down, the meta schema dropped at the end, the status server on a free port.
func tlsServeConfig(t *testing.T, e tlsEnv, down *sql.DB, id, broker, topic string) daemon.Config {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := daemon.DefaultConfig()
	cfg.Changefeed.ID = id
	cfg.Changefeed.Brokers, cfg.Changefeed.Topics = []string{broker}, []string{topic}
	cfg.Applier.MetaSchema = testenv.UniqueName("pm")
	cfg.Applier.SpillDir = t.TempDir()
	cfg.Applier.Workers = 4
	cfg.Status.Addr = addr
	cfg.Log.Level = "warn"
	cfg.Verify.Enabled = false
	cfg.API.Addr = "" // another daemon may hold the default port
	t.Cleanup(func() { _, _ = down.Exec("DROP DATABASE IF EXISTS " + ident.Quote(cfg.Applier.MetaSchema)) })
	return cfg
}

// runServeUntil runs serve until its applied checkpoint reaches ts, then stops it.
func runServeUntil(t *testing.T, ctx context.Context, cfg daemon.Config, ts uint64) {
	t.Helper()
	srv := runServeInTest(t, ctx, cfg)
	defer srv.Close()
	srv.WaitApplied(ts)
}

// runServeLogged runs serve with its log in w until it ends on its own (or 60 s pass).
func runServeLogged(ctx context.Context, cfg daemon.Config, w io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	stderr := os.Stderr
	r, wp, err := os.Pipe()
	if err != nil {
		return err
	}
	os.Stderr = wp // daemon.NewLogger writes to os.Stderr
	copied := make(chan struct{})
	go func() { _, _ = io.Copy(w, r); close(copied) }()
	err = runServe(ctx, cfg)
	os.Stderr = stderr
	wp.Close()
	<-copied
	r.Close()
	return err
}

// writeDiffConfig writes parity diff's config comparing schema db on tidb-tls with
// target on fallback-tls, both over TLS (down overrides the downstream's TLS when set).
func writeDiffConfig(t *testing.T, e tlsEnv, db, target string, down tlsauth.TLS) string {
	t.Helper()
	if down == (tlsauth.TLS{}) {
		down = tlsauth.TLS{CAFile: e.ca, CertFile: e.cert, KeyFile: e.key, ServerName: "parity-tls.test"}
	}
	type side struct {
		DSN string      `toml:"dsn"`
		TLS tlsauth.TLS `toml:"tls"`
	}
	cfg := struct {
		Tables     []string            `toml:"tables"`
		MetaSchema string              `toml:"meta-schema"`
		Routes     []map[string]string `toml:"routes"`
		Upstream   side                `toml:"upstream"`
		Downstream side                `toml:"downstream"`
	}{
		Tables:     []string{db + ".*"},
		MetaSchema: testenv.UniqueName("pmd"),
		Routes:     []map[string]string{{"from": db, "to": target}},
		Upstream:   side{e.up, tlsauth.TLS{CAFile: e.ca}},
		Downstream: side{e.down, down},
	}
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(cfg); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "diff.toml")
	if err := os.WriteFile(p, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func dsnPassword(t *testing.T, dsn string) string {
	t.Helper()
	i, j := strings.Index(dsn, ":"), strings.Index(dsn, "@")
	if i < 0 || j < i {
		t.Fatalf("no password in %q", dsn)
	}
	return dsn[i+1 : j]
}

// serve --check-config prints [changefeed.sasl] with the password redacted, and a start
// with insecure-skip-verify warns on stderr, naming the key.
func TestServeCheckConfigTLS(t *testing.T) {
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, []byte("not read by --check-config"), 0o600); err != nil {
		t.Fatal(err)
	}
	const secret = "sasl-secret-in-config-91"
	p := filepath.Join(dir, "parity.toml")
	text := fmt.Sprintf(`[changefeed]
brokers = ["127.0.0.1:9093"]
topics = ["t"]
[changefeed.tls]
ca-file = %q
[changefeed.sasl]
mechanism = "scram-sha-512"
username = "parity"
password = %q
[downstream]
dsn = "u:dsn-secret-55@tcp(127.0.0.1:3306)/"
[downstream.tls]
insecure-skip-verify = true
`, ca, secret)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCLI(t, "serve", "--config", p, "--check-config")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	for _, s := range []string{secret, "dsn-secret-55"} {
		if strings.Contains(stdout+stderr, s) {
			t.Fatalf("--check-config printed a secret:\n%s\n%s", stdout, stderr)
		}
	}
	for _, want := range []string{"[changefeed.sasl]", `mechanism = "scram-sha-512"`, `password = "REDACTED"`, "[downstream.tls]", "insecure-skip-verify = true"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("--check-config output lacks %q:\n%s", want, stdout)
		}
	}
	if !strings.Contains(stderr, "warning: downstream.tls.insecure-skip-verify is set: the server's certificate is NOT verified") {
		t.Errorf("no warning for insecure-skip-verify on stderr:\n%s", stderr)
	}

	// Every problem is reported with its key path.
	bad := fmt.Sprintf(`[changefeed]
brokers = ["127.0.0.1:9093"]
topics = ["t"]
[changefeed.sasl]
mechanism = "plain"
username = "parity"
password = %q
[downstream]
dsn = "u@tcp(127.0.0.1:3306)/?tls=true"
[downstream.tls]
cert-file = %q
[upstream.tls]
ca-file = %q
`, secret, ca, filepath.Join(dir, "missing.pem"))
	if err := os.WriteFile(p, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = runCLI(t, "serve", "--config", p, "--check-config")
	if code != 2 {
		t.Fatalf("exit %d, want 2\n%s\n%s", code, stdout, stderr)
	}
	for _, want := range []string{
		"changefeed.sasl.mechanism: plain sends the password in the clear: it needs TLS",
		"downstream.tls.key-file: is required with downstream.tls.cert-file",
		"downstream.tls: the DSN sets tls=true as well",
		"upstream.tls.ca-file: stat " + filepath.Join(dir, "missing.pem"),
		"upstream.tls: needs upstream.dsn",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("errors lack %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stdout+stderr, secret) {
		t.Fatalf("a secret in the errors:\n%s", stderr)
	}
}
