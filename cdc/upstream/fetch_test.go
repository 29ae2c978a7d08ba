package upstream_test

import (
	"context"
	"errors"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/cdc/upstream"
	"github.com/tidb-parity/parity/internal/testenv"
)

// TestFetchRow reads rows of TiDB tables by their handle key at two snapshots and checks
// them against a full scan at the same snapshot: a composite key of a case-insensitive
// string, binary bytes and an integer; a FLOAT key; a missing key; a table without a key.
func TestFetchRow(t *testing.T) {
	db := testenv.Upstream(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, q := range []string{
		"CREATE TABLE k (v VARCHAR(20) COLLATE utf8mb4_general_ci, b VARBINARY(8), n INT, f FLOAT, p LONGBLOB, e ENUM('x','y'), j JSON, PRIMARY KEY (v, b, n))",
		"INSERT INTO k VALUES ('Ab', x'00ff', 1, 1.1, x'01', 'y', '{\"a\": 1}'), ('ab ', x'00', -7, NULL, NULL, NULL, NULL), ('Ab', x'00ff', 2, -0.5, '', 'x', '[]')",
		"CREATE TABLE fk (f FLOAT PRIMARY KEY, s VARCHAR(5))",
		"INSERT INTO fk VALUES (1.1, 'one'), (-2.5, 'two')",
		"CREATE TABLE nokey (a INT, s VARCHAR(5))",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	ts1 := testenv.TiDBTSO(t, db.DB)
	if _, err := db.ExecContext(ctx, "UPDATE k SET p = x'0203', f = 3.25 WHERE n = 1"); err != nil {
		t.Fatal(err)
	}
	ts2 := testenv.TiDBTSO(t, db.DB)
	if ts2 <= ts1 {
		t.Fatalf("ts %d after ts %d", ts2, ts1)
	}

	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	at := func(ts uint64) {
		t.Helper()
		if _, err := conn.ExecContext(ctx, "SET @@tidb_snapshot = ?", strconv.FormatUint(ts, 10)); err != nil {
			t.Fatal(err)
		}
	}
	for _, ts := range []uint64{ts1, ts2} {
		at(ts)
		for _, table := range []string{"k", "fk"} {
			tb, err := upstream.LoadTable(ctx, conn, db.Name, table)
			if err != nil {
				t.Fatal(err)
			}
			rows, err := conn.QueryContext(ctx, "SELECT "+tb.SelectList()+" FROM "+tb.QualifiedName())
			if err != nil {
				t.Fatal(err)
			}
			all, _, err := upstream.ScanRows(rows, tb, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(all) < 2 {
				t.Fatalf("%s: %d rows", table, len(all))
			}
			for _, img := range all {
				got, err := upstream.FetchRow(ctx, conn, tb, handleOnly(img))
				if err != nil {
					t.Fatalf("%s at %d: fetch %v: %v", table, ts, img, err)
				}
				if !reflect.DeepEqual(got, img) {
					t.Errorf("%s at %d: fetched\n  %v\nwant\n  %v", table, ts, got, img)
				}
			}
		}
	}
	// The update is visible at ts2 only.
	tb, err := upstream.LoadTable(ctx, conn, db.Name, "k")
	if err != nil {
		t.Fatal(err)
	}
	key := []open.Column{{Name: "v", Value: "Ab"}, {Name: "b", Value: []byte{0, 0xff}}, {Name: "n", Value: int64(1)}}
	for ts, want := range map[uint64][]byte{ts1: {1}, ts2: {2, 3}} {
		at(ts)
		got, err := upstream.FetchRow(ctx, conn, tb, key)
		if err != nil {
			t.Fatal(err)
		}
		if p := got[tb.Col("p")].Value; !reflect.DeepEqual(p, want) {
			t.Errorf("p at %d = %v, want %v", ts, p, want)
		}
	}
	missing := []open.Column{{Name: "v", Value: "Ab"}, {Name: "b", Value: []byte{0, 0xff}}, {Name: "n", Value: int64(3)}}
	if _, err := upstream.FetchRow(ctx, conn, tb, missing); !errors.Is(err, upstream.ErrRowNotFound) {
		t.Errorf("missing key: err = %v, want ErrRowNotFound", err)
	}
	if _, err := upstream.FetchRow(ctx, conn, tb, key[:2]); err == nil {
		t.Error("a key without column n was accepted")
	}
	nk, err := upstream.LoadTable(ctx, conn, db.Name, "nokey")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := upstream.FetchRow(ctx, conn, nk, []open.Column{{Name: "a", Value: int64(1)}}); err == nil {
		t.Error("a table without a handle key was accepted")
	}
}

// handleOnly keeps the handle-key columns of a row image, as a handle-key-only event does.
func handleOnly(img []open.Column) []open.Column {
	var out []open.Column
	for _, c := range img {
		if c.IsHandle() {
			out = append(out, c)
		}
	}
	return out
}
