package checker

// Fix SQL against the real servers: rows a foreign key references, zero dates, ignored
// columns a missing row is inserted with.

import (
	"context"
	"strings"
	"testing"
)

// TestFixSQLForeignKeys: fix SQL for a table that a foreign key references updates rows
// in place. REPLACE deletes the old row first, and the ON DELETE CASCADE of the child
// table deleted the children of every row the fix repaired.
func TestFixSQLForeignKeys(t *testing.T) {
	p := mariaPair(t)
	p.both(t, "CREATE TABLE fp (id INT PRIMARY KEY, v INT)",
		"CREATE TABLE fc (id INT PRIMARY KEY, pid INT NOT NULL, FOREIGN KEY (pid) REFERENCES fp (id) ON DELETE CASCADE)",
		"INSERT INTO fp VALUES (1, 1), (2, 2), (3, 3)",
		"INSERT INTO fc VALUES (10, 1), (20, 2), (30, 3)")
	exec(t, p.down.DB, "UPDATE fp SET v = 99 WHERE id = 2", "DELETE FROM fc WHERE id = 30", "DELETE FROM fp WHERE id = 3")
	cfg := p.config(t, "fp", "fc")
	rep := run(t, cfg)
	tr := tableReport(t, rep, "fp")
	if tr.DifferencesTotal != 2 {
		t.Fatalf("fp: %d differences, want 2", tr.DifferencesTotal)
	}
	fix := readFix(t, cfg, tr)
	if strings.Contains(fix, "REPLACE INTO") || !strings.Contains(fix, "ON DUPLICATE KEY UPDATE") {
		t.Fatalf("fix SQL of a referenced table:\n%s", fix)
	}
	applyFix(t, p.down.DB, fix) // the parent rows first, then the children
	applyFix(t, p.down.DB, readFix(t, cfg, tableReport(t, rep, "fc")))
	var children int
	if err := p.down.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM fc").Scan(&children); err != nil || children != 3 {
		t.Fatalf("%d child rows after the fix (%v), want 3", children, err)
	}
	// The child table itself is not referenced: REPLACE stays.
	if tr := tableReport(t, rep, "fc"); !strings.Contains(readFix(t, cfg, tr), "REPLACE INTO") {
		t.Error("fix SQL of an unreferenced table does not use REPLACE")
	}
	cfg.OutputDir = t.TempDir()
	if rep := run(t, cfg); !rep.Equal {
		t.Errorf("after the fix SQL: %+v", rep.Tables)
	}
}

// TestFixSQLZeroDates: fix SQL applies on a server whose sql_mode refuses zero dates
// (MySQL 8's default has NO_ZERO_DATE and NO_ZERO_IN_DATE): the rows hold them upstream,
// and the header lifts those two modes for its session only.
func TestFixSQLZeroDates(t *testing.T) {
	p := mariaPair(t)
	p.both(t, "CREATE TABLE zd (id INT PRIMARY KEY, d DATETIME, dt DATE)")
	execSession(t, &p, true, "SET SESSION sql_mode = ''",
		"INSERT INTO zd VALUES (1, '0000-00-00 00:00:00', '2020-00-15'), (2, '2021-01-01 00:00:00', '0000-00-00'), (3, NULL, '2022-02-02')")
	execSession(t, &p, false, "SET SESSION sql_mode = ''", "INSERT INTO zd VALUES (3, NULL, '2022-02-02')")
	cfg := p.config(t, "zd")
	tr := tableReport(t, run(t, cfg), "zd")
	if tr.DifferencesTotal != 2 {
		t.Fatalf("%d differences, want 2", tr.DifferencesTotal)
	}
	ctx := context.Background()
	conn, err := p.down.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SET SESSION sql_mode = 'STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO'"); err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(readFix(t, cfg, tr), "\n") {
		if line == "" || strings.HasPrefix(line, "--") {
			continue
		}
		if _, err := conn.ExecContext(ctx, line); err != nil {
			t.Fatalf("apply %q under a strict sql_mode: %v", line, err)
		}
	}
	var mode string
	if err := conn.QueryRowContext(ctx, "SELECT @@SESSION.sql_mode").Scan(&mode); err != nil || mode != "STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO" {
		t.Errorf("sql_mode after the header %q (%v): only the zero-date modes should go", mode, err)
	}
	cfg.OutputDir = t.TempDir()
	if rep := run(t, cfg); !rep.Equal {
		t.Errorf("after the fix SQL: %+v", rep.Tables)
	}
}

// TestFixSQLIgnoredColumns: an ignored column is not compared, but a row the fix SQL
// inserts gets the upstream's value of it (a NOT NULL column without a default refused the
// insert before), also for a long column (a JSON document here), while rows that exist
// downstream keep theirs.
func TestFixSQLIgnoredColumns(t *testing.T) {
	p := mariaPair(t)
	p.both(t, "CREATE TABLE ig (id INT PRIMARY KEY, v INT, note VARCHAR(20) NOT NULL, big JSON NOT NULL)")
	exec(t, p.up.DB, `INSERT INTO ig VALUES (1, 1, 'n1', '{"b":1}'), (2, 2, 'n2', '{"b":2}'), (3, 3, 'n3', '{"b":3}')`)
	exec(t, p.down.DB, `INSERT INTO ig VALUES (1, -1, 'down1', '"x"'), (3, 3, 'down3', '"y"')`)
	cfg := p.config(t, "ig")
	cfg.IgnoreColumns = []string{"*.ig.note", "*.ig.big"}
	rep := run(t, cfg)
	tr := tableReport(t, rep, "ig")
	if got := diffsByKind(tr); tr.DifferencesTotal != 2 || got[Missing] != 1 || got[Differing] != 1 {
		t.Fatalf("want row 2 missing and row 1 differing (in v), got %+v", tr.Differences)
	}
	applyFix(t, p.down.DB, readFix(t, cfg, tr))
	got := firstColumn(t, p.down.DB, "SELECT CONCAT_WS(',', id, v, note, big) FROM ig ORDER BY id")
	want := []string{`1,1,down1,"x"`, `2,2,n2,{"b":2}`, `3,3,down3,"y"`}
	if strings.Join(got, ";") != strings.Join(want, ";") {
		t.Fatalf("downstream after the fix: %q, want %q", got, want)
	}
}
