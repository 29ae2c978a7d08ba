package testenv

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// TestPrivateMariaDBRestartAndProxy: a private MariaDB answers through a proxy, a
// timeout toxic makes a query through it time out, SIGKILL and start again keep a
// committed row (crash recovery), and a cut proxy refuses connections until restored.
func TestPrivateMariaDBRestartAndProxy(t *testing.T) {
	t.Parallel()
	m := StartMariaDB(t)
	p := NewProxy(t, "mariadb", m.Addr)
	db, err := sql.Open("mysql", p.DSN(t, m.DSN)+"?timeout=2s&readTimeout=2s")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	mustExec := func(q string) {
		t.Helper()
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	mustExec("CREATE DATABASE d")
	mustExec("CREATE TABLE d.t (id INT PRIMARY KEY)")
	mustExec("INSERT INTO d.t VALUES (1)")
	p.Add(t, Toxic{Name: "hang", Type: "timeout", Attributes: map[string]any{"timeout": 0}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	start := time.Now()
	err = db.QueryRowContext(ctx, "SELECT 1").Scan(new(int))
	cancel()
	if err == nil {
		t.Fatal("a query through a proxy that drops everything succeeded")
	}
	t.Logf("through the timeout toxic: %v after %v", err, time.Since(start).Round(time.Millisecond))
	p.Remove(t, "hang")
	m.Kill(t)
	m.Start(t)
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM d.t").Scan(&n); err != nil || n != 1 {
		t.Fatalf("after SIGKILL and restart: %d rows, %v", n, err)
	}
	if !strings.Contains(m.ErrorLog(), "crash recovery") && !strings.Contains(m.ErrorLog(), "Starting crash recovery") {
		t.Logf("error log does not mention crash recovery:\n%s", m.ErrorLog())
	}
	p.Cut()
	db.SetMaxIdleConns(0)
	if err := db.Ping(); err == nil {
		t.Fatal("ping through a cut proxy succeeded")
	}
	p.Restore(t)
	if err := db.Ping(); err != nil {
		t.Fatalf("ping after restore: %v", err)
	}
}

// TestPrivateKafkaThroughProxy: a consumer bootstrapping through the proxy is told the
// proxy's address for the partition leader, so cutting the proxy stops its fetches.
func TestPrivateKafkaThroughProxy(t *testing.T) {
	t.Parallel()
	k := StartKafka(t, 1)
	topic := k.NewTopic(t, "priv", 1)
	conn, err := kafka.Dial("tcp", k.Proxies[0].Addr)
	if err != nil {
		t.Fatal(err)
	}
	parts, err := conn.ReadPartitions(topic)
	conn.Close()
	if err != nil || len(parts) != 1 {
		t.Fatalf("partitions: %v %v", parts, err)
	}
	if got := parts[0].Leader.Host + ":" + strconv.Itoa(parts[0].Leader.Port); got != k.Proxies[0].Addr {
		t.Fatalf("leader advertised as %s through the proxy, want the proxy %s", got, k.Proxies[0].Addr)
	}
	w, err := kafka.DialLeader(context.Background(), "tcp", k.Addr, topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteMessages(kafka.Message{Value: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	k.Stop(t)
	k.Start(t)
	r, err := kafka.DialLeader(context.Background(), "tcp", k.Proxies[0].Addr, topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	last, err := r.ReadLastOffset()
	if err != nil || last != 1 {
		t.Fatalf("after a restart: last offset %d, %v", last, err)
	}
}
