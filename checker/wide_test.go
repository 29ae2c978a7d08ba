package checker

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tidb-parity/parity/internal/testenv"
)

// TestRowsWiderThanPacket compares rows whose row encoding is longer than the server's
// max_allowed_packet (the peer MariaDB of scripts/env runs with MariaDB's default, 16
// MiB). The server turns such a CONCAT_WS into NULL, so before fitEncoding their hash was
// NULL on both sides, SUM skipped them, and a changed byte in them was never seen. Both
// sides live on the peer. The changes are found with the right columns, the differences
// (tens of MiB of fix SQL) are stored and read back, and the fix SQL, whose statements
// stay far below the packet, makes the sides equal.
func TestRowsWiderThanPacket(t *testing.T) {
	p := pair{up: testenv.MySQL(t), down: testenv.MySQL(t)}
	ctx := context.Background()
	var packet int64
	if err := p.up.QueryRowContext(ctx, "SELECT @@max_allowed_packet").Scan(&packet); err != nil {
		t.Fatal(err)
	}
	if packet > 64<<20 {
		t.Fatalf("the peer MariaDB runs with max_allowed_packet %d; scripts/env starts it with 16M (restart it: scripts/env down; scripts/env up)", packet)
	}
	half := packet/2 + 4096 // two such values make a row wider than the packet
	wide := func(c string) string { return fmt.Sprintf("REPEAT('%s', %d)", c, half) }
	p.both(t, "CREATE TABLE w (id INT PRIMARY KEY, a MEDIUMBLOB NOT NULL, b MEDIUMTEXT, n INT)",
		"INSERT INTO w VALUES (1, "+wide("a")+", CONCAT("+wide("b")+", 'é'), 1)",
		"INSERT INTO w VALUES (2, "+wide("a")+", "+wide("b")+", 2)",
		"INSERT INTO w VALUES (3, 'x', 'y', 3)",
		"INSERT INTO w VALUES (4, "+wide("a")+", NULL, 4)")
	exec(t, p.up.DB, "INSERT INTO w VALUES (5, "+wide("c")+", "+wide("d")+", 5)")
	exec(t, p.down.DB,
		"UPDATE w SET b = CONCAT("+wide("b")+", 'è') WHERE id = 1", // the last character
		"UPDATE w SET n = 30 WHERE id = 3",
		fmt.Sprintf("UPDATE w SET a = CONCAT('A', REPEAT('a', %d)) WHERE id = 4", half-1), // the first byte
		"INSERT INTO w VALUES (6, "+wide("e")+", "+wide("f")+", 6)")
	var over int
	if err := p.up.QueryRowContext(ctx, "SELECT COUNT(*) FROM w WHERE CONCAT_WS(',', id, LENGTH(a), a, LENGTH(b), b, n) IS NULL").Scan(&over); err != nil {
		t.Fatal(err)
	}
	if over != 3 { // rows 1, 2 and 5: the hole this test is about
		t.Fatalf("%d rows have an encoding wider than the packet, want 3", over)
	}

	cfg := p.config(t, "w")
	rep := run(t, cfg)
	tr := tableReport(t, rep, "w")
	var got []string
	for _, d := range tr.Differences {
		got = append(got, fmt.Sprintf("%s %s %v", d.Kind, d.Key[0].Value, d.Columns))
	}
	want := []string{"differing 1 [b]", "differing 3 [n]", "differing 4 [a]", "missing 5 []", "extra 6 []"}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("differences %q, want %q", got, want)
	}
	fix := readFix(t, cfg, tr)
	longest := 0
	for line := range strings.SplitSeq(fix, "\n") {
		longest = max(longest, len(line))
	}
	if longest > fixLiteralBytes+1024 {
		t.Errorf("a fix statement is %d bytes long", longest)
	}
	applyFix(t, p.down.DB, fix)
	cfg.OutputDir = t.TempDir()
	if rep := run(t, cfg); !rep.Equal {
		t.Errorf("after the fix SQL: %+v", tableReport(t, rep, "w"))
	}
}
