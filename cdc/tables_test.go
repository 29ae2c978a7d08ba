package cdc

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tidb-parity/parity/internal/rowkey"
	"github.com/tidb-parity/parity/internal/testenv"
)

// TestLoadTableInfo reads a table's unique indexes and collations from the real
// fallback: index columns in the table's column order (not the index's), a unique
// prefix index marked, a non-unique index left out, each text column's class. It also
// checks the reads look at that table alone: with 40 other tables in its schema (and
// the server's others), the session's Handler_tmp_write (rows MariaDB put into temporary
// tables to answer information_schema) stays under half the decoys' columns. Joined on the
// STATISTICS side's names only, the index query filled COLUMNS from every table of the
// server (3,651 rows on the test server with 354 tables).
func TestLoadTableInfo(t *testing.T) {
	down := testenv.Downstream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	exec := func(q string) {
		t.Helper()
		if _, err := down.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec("CREATE TABLE t (a INT NOT NULL, b VARCHAR(20) COLLATE utf8mb4_general_ci NOT NULL, c VARCHAR(40) COLLATE utf8mb4_bin, " +
		"d VARBINARY(20), e VARCHAR(20) COLLATE utf8mb4_german2_ci, k INT, " +
		"PRIMARY KEY (a), UNIQUE KEY ba (b, a), UNIQUE KEY cp (c(10)), KEY kk (k)) ENGINE=InnoDB")
	// Decoys: 40 tables of 6 columns, which a query reading the whole server would pass through.
	const decoys, decoyCols = 40, 6
	for i := range decoys {
		exec(fmt.Sprintf("CREATE TABLE decoy%d (id INT PRIMARY KEY, c1 INT, c2 INT, c3 INT, c4 INT, c5 INT, UNIQUE KEY u (c1))", i))
	}

	// One connection, so that the session's counters are the reads' own.
	db, err := sql.Open("mysql", down.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	tmpWrites := func() int64 {
		t.Helper()
		var name string
		var n int64
		if err := db.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Handler_tmp_write'").Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := tmpWrites()
	info, err := loadTableInfo(ctx, db, down.Name, "t")
	if err != nil {
		t.Fatal(err)
	}
	// SHOW SESSION STATUS itself writes a temporary row per status variable: measure one.
	self := tmpWrites()
	showCost := tmpWrites() - self
	reads := self - before - showCost
	// The table's own rows: its 6 columns twice and its index columns (21 on MariaDB
	// 10.11). A read of the schema alone would pass through the decoys' 240 columns.
	if reads >= decoys*decoyCols/2 {
		t.Errorf("reading one table's indexes and columns wrote %d rows into temporary tables; the table has 6 columns "+
			"(the server holds %d more tables of %d columns: the query read beyond the table)", reads, decoys, decoyCols)
	}
	t.Logf("temporary rows for the reads: %d (SHOW STATUS alone: %d)", reads, showCost)

	if !info.exists {
		t.Fatal("exists = false for a table that exists")
	}
	want := [][]string{{"a", "b"}, {"c(prefix)"}, {"a"}} // by index name: ba, cp, PRIMARY; columns in the table's order
	if !slices.EqualFunc(info.uniques, want, slices.Equal[[]string]) {
		t.Errorf("uniques = %q, want %q", info.uniques, want)
	}
	for col, class := range map[string]rowkey.Class{
		"a": rowkey.Exact, "b": rowkey.Folded, "c": rowkey.PadSpace, "d": rowkey.Exact, "e": rowkey.Opaque, "k": rowkey.Exact,
	} {
		if got, ok := info.classes[col]; !ok || got != class {
			t.Errorf("class of %s = %v (known %t), want %v", col, got, ok, class)
		}
	}

	missing, err := loadTableInfo(ctx, db, down.Name, "nope")
	if err != nil {
		t.Fatal(err)
	}
	if missing.exists || len(missing.uniques) != 0 {
		t.Errorf("a missing table: exists %t, uniques %q", missing.exists, missing.uniques)
	}
}
