package testenv_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidb-parity/parity/internal/testenv"
)

// TestKafkaRoundTrip produces keyed messages to a 3-partition topic on the real broker and
// reads every one of them back from every partition.
func TestKafkaRoundTrip(t *testing.T) {
	t.Parallel()
	broker := testenv.Kafka(t)
	topic := testenv.NewTopic(t, "envcheck", 3)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	w := &kafka.Writer{Addr: kafka.TCP(broker), Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll}
	defer w.Close()
	const n = 30
	var sent []string
	var msgs []kafka.Message
	for i := range n {
		v := fmt.Sprintf("value-%02d", i)
		sent = append(sent, v)
		msgs = append(msgs, kafka.Message{Key: []byte(fmt.Sprintf("key-%d", i)), Value: []byte(v)})
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatalf("produce: %v", err)
	}

	var got []string
	perPartition := map[int]int{}
	for p := range 3 {
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{broker}, Topic: topic, Partition: p, MaxWait: 100 * time.Millisecond})
		conn, err := kafka.DialLeader(ctx, "tcp", broker, topic, p)
		if err != nil {
			t.Fatalf("dial leader of partition %d: %v", p, err)
		}
		last, err := conn.ReadLastOffset()
		conn.Close()
		if err != nil {
			t.Fatalf("last offset of partition %d: %v", p, err)
		}
		for off := int64(0); off < last; off++ {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				t.Fatalf("consume partition %d: %v", p, err)
			}
			got = append(got, string(m.Value))
			perPartition[p]++
		}
		r.Close()
	}
	sort.Strings(got)
	if fmt.Sprint(got) != fmt.Sprint(sent) {
		t.Fatalf("consumed %v, want %v", got, sent)
	}
	if len(perPartition) < 2 {
		t.Fatalf("messages landed on %d partition(s) only: %v", len(perPartition), perPartition)
	}
}

// TestTiDBSnapshotRead writes a row, takes its commit ts from @@tidb_last_txn_info,
// updates the row and reads the old value back with tidb_snapshot at that commit ts.
func TestTiDBSnapshotRead(t *testing.T) {
	t.Parallel()
	db := testenv.Upstream(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	mustExec := func(q string, args ...any) {
		t.Helper()
		if _, err := conn.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	mustExec("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))")
	mustExec("INSERT INTO t VALUES (1, 'old')")
	var info string
	if err := conn.QueryRowContext(ctx, "SELECT @@tidb_last_txn_info").Scan(&info); err != nil {
		t.Fatal(err)
	}
	var txn struct {
		CommitTS uint64 `json:"commit_ts"`
	}
	if err := json.Unmarshal([]byte(info), &txn); err != nil || txn.CommitTS == 0 {
		t.Fatalf("tidb_last_txn_info %q: commit_ts missing (%v)", info, err)
	}
	mustExec("UPDATE t SET v = 'new' WHERE id = 1")

	var v string
	mustExec(fmt.Sprintf("SET @@tidb_snapshot = '%d'", txn.CommitTS))
	if err := conn.QueryRowContext(ctx, "SELECT v FROM t WHERE id = 1").Scan(&v); err != nil {
		t.Fatal(err)
	}
	if v != "old" {
		t.Fatalf("at commit ts %d read %q, want %q", txn.CommitTS, v, "old")
	}
	mustExec(fmt.Sprintf("SET @@tidb_snapshot = '%d'", txn.CommitTS-1))
	if err := conn.QueryRowContext(ctx, "SELECT v FROM t WHERE id = 1").Scan(&v); !errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("at commit ts-1 read %q (%v); want no row", v, err)
	}
	mustExec("SET @@tidb_snapshot = ''")
	if err := conn.QueryRowContext(ctx, "SELECT v FROM t WHERE id = 1").Scan(&v); err != nil || v != "new" {
		t.Fatalf("current read %q (%v), want new", v, err)
	}
}

// TestMariaDBConsistentSnapshot opens START TRANSACTION WITH CONSISTENT SNAPSHOT on both
// MariaDB servers and checks that a commit made afterwards is not visible inside it.
func TestMariaDBConsistentSnapshot(t *testing.T) {
	t.Parallel()
	for _, mk := range []func(testing.TB) *testenv.DB{testenv.Downstream, testenv.MySQL} {
		db := mk(t)
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		if _, err := db.ExecContext(ctx, "CREATE TABLE t (id INT PRIMARY KEY, v INT) ENGINE=InnoDB"); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, "INSERT INTO t VALUES (1, 1)"); err != nil {
			t.Fatal(err)
		}
		snap, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := snap.ExecContext(ctx, "START TRANSACTION WITH CONSISTENT SNAPSHOT"); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, "UPDATE t SET v = 2 WHERE id = 1"); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, "INSERT INTO t VALUES (2, 2)"); err != nil {
			t.Fatal(err)
		}
		var v, n int
		if err := snap.QueryRowContext(ctx, "SELECT v FROM t WHERE id = 1").Scan(&v); err != nil {
			t.Fatal(err)
		}
		if err := snap.QueryRowContext(ctx, "SELECT COUNT(*) FROM t").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if v != 1 || n != 1 {
			t.Fatalf("%s: inside the snapshot v=%d rows=%d, want v=1 rows=1", db.Root, v, n)
		}
		_, _ = snap.ExecContext(ctx, "ROLLBACK")
		if err := snap.QueryRowContext(ctx, "SELECT COUNT(*) FROM t").Scan(&n); err != nil || n != 2 {
			t.Fatalf("%s: after the snapshot rows=%d (%v), want 2", db.Root, n, err)
		}
		snap.Close()
	}
}
