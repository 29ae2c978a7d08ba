// Package testenv connects integration tests to the real servers that scripts/env starts
// (TiDB, two MariaDB servers, Kafka). It exists so every test finds the servers the same
// way: from the PARITY_TEST_* variables written to var/env.sh. It also holds the tests'
// one table comparator (tables.go reads, compare.go compares), which proves two schemas
// hold the same rows with plain SQL and must never import checker or cdc: a bug there
// cannot hide a bug it tests.
//
// Locally a test whose server is not configured is skipped with a message; when CI=true a
// missing server fails the test, so CI can never pass by skipping.
package testenv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/segmentio/kafka-go"
)

// Variables read by the helpers; scripts/env up writes them to var/env.sh.
const (
	EnvUpstream   = "PARITY_TEST_UPSTREAM_DSN"   // TiDB
	EnvDownstream = "PARITY_TEST_DOWNSTREAM_DSN" // fallback MariaDB
	EnvMySQL      = "PARITY_TEST_MYSQL_DSN"      // second MariaDB
	EnvKafka      = "PARITY_TEST_KAFKA"          // bootstrap address
	// EnvTiDBOldCollation is a TiDB bootstrapped without new collations: it compares every
	// string as binary bytes (NO PAD), whatever collation a column declares.
	EnvTiDBOldCollation = "PARITY_TEST_TIDB_OLDCOLL_DSN"

	// The TLS and SASL targets (scripts/env's fallback-tls, tidb-tls and kafka-tls): none
	// answers without TLS. EnvTLSDir holds ca.pem, client.pem and client-key.pem.
	EnvTLSDir           = "PARITY_TEST_TLS_DIR"
	EnvTLSMySQL         = "PARITY_TEST_TLS_MYSQL_DSN"      // MariaDB, REQUIRE SSL
	EnvTLSMySQLX509     = "PARITY_TEST_TLS_MYSQL_X509_DSN" // MariaDB, REQUIRE X509
	EnvTLSTiDB          = "PARITY_TEST_TLS_TIDB_DSN"
	EnvTLSKafkaSSL      = "PARITY_TEST_TLS_KAFKA_SSL"      // client certificate required
	EnvTLSKafkaSASLSSL  = "PARITY_TEST_TLS_KAFKA_SASL_SSL" // PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
	EnvTLSKafkaUser     = "PARITY_TEST_TLS_KAFKA_SASL_USER"
	EnvTLSKafkaPassword = "PARITY_TEST_TLS_KAFKA_SASL_PASSWORD"
)

// Lookup returns the value of an environment variable, falling back to var/env.sh at the
// repository root so `go test ./...` works after `make env-up` without sourcing anything.
func Lookup(name string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fromEnvFile(name)
}

func fromEnvFile(name string) string {
	if os.Getenv("PARITY_TEST_NO_ENV_FILE") == "1" {
		return ""
	}
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			data, err := os.ReadFile(filepath.Join(dir, "var", "env.sh"))
			if err != nil {
				return ""
			}
			re := regexp.MustCompile(`(?m)^export ` + regexp.QuoteMeta(name) + `='([^']*)'`)
			if m := re.FindSubmatch(data); m != nil {
				return string(m[1])
			}
			return ""
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// Require returns the variable's value, or skips (locally) / fails (CI=true) the test.
func Require(t testing.TB, name string) string {
	t.Helper()
	v := Lookup(name)
	if v != "" {
		return v
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is not set: CI must run against the real test environment (make env-up)", name)
	}
	t.Skipf("%s is not set; run `make env-up` to test against the real servers", name)
	return ""
}

// UniqueName returns prefix_<random>, safe as a database or topic name, so tests can run
// in parallel and be re-run without cleanup.
func UniqueName(prefix string) string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s_%s", prefix, hex.EncodeToString(b[:]))
}

// DSN returns the DSN in env var name with the database set and parseTime off (parity
// reads temporal values as text), plus extra parameters.
func DSN(t testing.TB, name, database string, params map[string]string) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(Require(t, name))
	if err != nil {
		t.Fatalf("parse %s: %v", name, err)
	}
	cfg.DBName = database
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	for k, v := range params {
		cfg.Params[k] = v
	}
	cfg.MultiStatements = false
	return cfg.FormatDSN()
}

// DB is a database created for one test on one server.
type DB struct {
	*sql.DB
	Name string // the database (schema) name
	DSN  string // a DSN selecting Name
	Root string // the server's DSN without a database
}

// NewDB creates a fresh database on the server named by env var name, and drops it when
// the test ends (unless PARITY_TEST_KEEP=1).
func NewDB(t testing.TB, name, prefix string) *DB {
	t.Helper()
	root := Require(t, name)
	db := UniqueName(prefix)
	admin := open(t, DSN(t, name, "", nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE `"+db+"`"); err != nil {
		t.Fatalf("create database %s: %v", db, err)
	}
	t.Cleanup(func() {
		if os.Getenv("PARITY_TEST_KEEP") == "1" {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+db+"`"); err != nil {
			t.Logf("drop database %s: %v", db, err)
		}
	})
	dsn := DSN(t, name, db, nil)
	return &DB{DB: open(t, dsn), Name: db, DSN: dsn, Root: root}
}

func open(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatalf("open %s: %v", dsn, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		if os.Getenv("CI") != "true" {
			t.Skipf("server %s does not answer (%v); run `make env-up`", dsn, err)
		}
		t.Fatalf("server %s does not answer: %v", dsn, err)
	}
	return db
}

// Upstream, Downstream and MySQL create a fresh database on TiDB, the fallback MariaDB
// and the peer MariaDB.
func Upstream(t testing.TB) *DB   { return NewDB(t, EnvUpstream, "pt") }
func Downstream(t testing.TB) *DB { return NewDB(t, EnvDownstream, "pt") }
func MySQL(t testing.TB) *DB      { return NewDB(t, EnvMySQL, "pt") }

// TiDBOldCollation creates a fresh database on the TiDB without new collations.
func TiDBOldCollation(t testing.TB) *DB { return NewDB(t, EnvTiDBOldCollation, "pt") }

// Kafka returns the bootstrap address of the test Kafka.
func Kafka(t testing.TB) string { return Require(t, EnvKafka) }

// NewTopic creates a topic with the given partitions on the test Kafka and deletes it
// when the test ends.
func NewTopic(t testing.TB, prefix string, partitions int) string {
	t.Helper()
	return newTopicOn(t, Kafka(t), prefix, partitions)
}

func newTopicOn(t testing.TB, broker, prefix string, partitions int) string {
	t.Helper()
	topic := strings.ReplaceAll(UniqueName(prefix), "_", "-")
	conn, err := kafka.Dial("tcp", broker)
	if err != nil {
		t.Fatalf("dial kafka %s: %v", broker, err)
	}
	defer conn.Close()
	ctrl, err := conn.Controller()
	if err != nil {
		t.Fatalf("kafka controller: %v", err)
	}
	cc, err := kafka.Dial("tcp", net.JoinHostPort(ctrl.Host, strconv.Itoa(ctrl.Port)))
	if err != nil {
		t.Fatalf("dial kafka controller: %v", err)
	}
	defer cc.Close()
	if err := cc.CreateTopics(kafka.TopicConfig{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}); err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	DeleteTopicAtEnd(t, broker, topic)
	waitTopic(t, broker, topic, partitions)
	return topic
}

// DeleteTopicAtEnd deletes topic from the test Kafka when the test ends (unless
// PARITY_TEST_KEEP=1): for topics a test creates, or lets the code under test create.
func DeleteTopicAtEnd(t testing.TB, broker, topic string) {
	t.Cleanup(func() {
		if os.Getenv("PARITY_TEST_KEEP") == "1" {
			return
		}
		conn, err := kafka.Dial("tcp", broker)
		if err != nil {
			return
		}
		defer conn.Close()
		ctrl, err := conn.Controller()
		if err != nil {
			return
		}
		c, err := kafka.Dial("tcp", net.JoinHostPort(ctrl.Host, strconv.Itoa(ctrl.Port)))
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.DeleteTopics(topic)
	})
}

func waitTopic(t testing.TB, broker, topic string, partitions int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if topicReady(broker, topic, partitions) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("topic %s did not get %d partitions with working leaders in 30s", topic, partitions)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// topicReady reports whether every partition has a leader in the metadata and that leader
// answers a ListOffsets request for it: metadata can name a leader before the broker has
// taken the partition over, and a produce then fails with "Not Leader For Partition".
func topicReady(broker, topic string, partitions int) bool {
	conn, err := kafka.Dial("tcp", broker)
	if err != nil {
		return false
	}
	parts, err := conn.ReadPartitions(topic)
	conn.Close()
	if err != nil || len(parts) != partitions {
		return false
	}
	for _, p := range parts {
		if p.Leader.Host == "" {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		lc, err := kafka.DialLeader(ctx, "tcp", broker, topic, p.ID)
		cancel()
		if err != nil {
			return false
		}
		_ = lc.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = lc.ReadLastOffset()
		lc.Close()
		if err != nil {
			return false
		}
	}
	return true
}

// ReadTopic returns every record of every partition of topic, in offset order, as stored
// at the moment each partition is read.
func ReadTopic(t testing.TB, broker, topic string, partitions int) [][]kafka.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := make([][]kafka.Message, partitions)
	for p := 0; p < partitions; p++ {
		conn, err := kafka.DialLeader(ctx, "tcp", broker, topic, p)
		if err != nil {
			t.Fatalf("dial partition %d: %v", p, err)
		}
		last, err := conn.ReadLastOffset()
		if err != nil {
			t.Fatalf("last offset of partition %d: %v", p, err)
		}
		for off := int64(0); off < last; {
			if _, err := conn.Seek(off, kafka.SeekAbsolute); err != nil {
				t.Fatalf("seek partition %d to %d: %v", p, off, err)
			}
			_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
			batch := conn.ReadBatchWith(kafka.ReadBatchConfig{MinBytes: 1, MaxBytes: 32 << 20, MaxWait: 100 * time.Millisecond})
			for off < last {
				m, err := batch.ReadMessage()
				if err != nil {
					break
				}
				out[p] = append(out[p], m)
				off = m.Offset + 1
			}
			_ = batch.Close()
		}
		conn.Close()
	}
	return out
}

// TiDBTSO returns a TiDB TSO later than every commit so far: the start ts of a new
// transaction (@@tidb_current_ts is 0 outside one).
func TiDBTSO(t testing.TB, db *sql.DB) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	var ts uint64
	if err := tx.QueryRowContext(ctx, "SELECT @@tidb_current_ts").Scan(&ts); err != nil {
		t.Fatalf("read @@tidb_current_ts: %v", err)
	}
	if ts == 0 {
		t.Fatal("@@tidb_current_ts is 0 inside a transaction")
	}
	return ts
}

// User is an account created for one test (NewUser).
type User struct {
	Name    string // the user name, as PROCESSLIST's USER shows it
	Account string // 'name'@'127.0.0.1', quoted for GRANT and REVOKE
	DSN     string // the server's DSN (NewUser's root) as this user
}

// NewUser creates an account of its own on the server of root (a DSN allowed to create
// users), named prefix_<random>@127.0.0.1 with every privilege, and drops it when the
// test ends. Its connections are told apart from every other test's in PROCESSLIST.
func NewUser(t testing.TB, root, prefix string) User {
	t.Helper()
	cfg, err := mysql.ParseDSN(root)
	if err != nil {
		t.Fatalf("NewUser: the root DSN: %v", err) // not the DSN itself: it may hold a password
	}
	name := UniqueName(prefix)
	account := "'" + name + "'@'127.0.0.1'"
	if err := execSQL(root, "CREATE USER "+account+" IDENTIFIED BY '"+prefix+"'", "GRANT ALL PRIVILEGES ON *.* TO "+account); err != nil {
		t.Fatalf("creating the user %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := execSQL(root, "DROP USER IF EXISTS "+account); err != nil {
			t.Logf("dropping the user %s: %v", name, err)
		}
	})
	cfg.User, cfg.Passwd = name, prefix
	return User{Name: name, Account: account, DSN: cfg.FormatDSN()}
}
