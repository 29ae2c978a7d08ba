package checker

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestRowEncodingInjective hashes every combination of values chosen to collide under a
// careless encoding (NULL, ”, 'N', 'NULL', separators, digits, values that could move
// between columns), including the last NOT NULL string column that is encoded without a
// length prefix, and checks that all rows hash differently and that TiDB and MariaDB
// compute the same hashes.
func TestRowEncodingInjective(t *testing.T) {
	p := tidbPair(t)
	p.both(t, "CREATE TABLE enc (n VARCHAR(10) NULL, a VARCHAR(10) NOT NULL, i INT NULL, b VARBINARY(10) NOT NULL, z VARCHAR(10) NULL) CHARSET utf8mb4 COLLATE utf8mb4_bin")
	lit := func(v string) string {
		if v == "NULL" {
			return v
		}
		return "'" + strings.TrimPrefix(v, "=") + "'"
	}
	var vals []string
	for _, n := range []string{"NULL", "", "=NULL", "N", ",", "a", "a,", ",a", "1", "1,", "0:"} {
		for _, a := range []string{"", ",", "N", "1", "a,1", "1:,"} {
			for _, i := range []string{"NULL", "1", "11"} {
				for _, b := range []string{"", ",", "N", "1,", ",1", "0:"} {
					for _, z := range []string{"NULL", "", "N"} {
						vals = append(vals, fmt.Sprintf("(%s,%s,%s,%s,%s)", lit(n), lit(a), i, lit(b), lit(z)))
					}
				}
			}
		}
	}
	for start := 0; start < len(vals); start += 500 {
		p.both(t, "INSERT INTO enc VALUES "+strings.Join(vals[start:min(start+500, len(vals))], ","))
	}
	ctx := context.Background()
	plan := p.plan(t, "enc", FlavorTiDB)
	if raw := plan.rawLast(); raw < 0 || plan.Columns[raw].Name != "b" {
		t.Fatalf("rawLast = %d, want the column b", raw)
	}
	hashes := func(s Side) []string {
		db := p.up.DB
		if s == Downstream {
			db = p.down.DB
		}
		rows, err := db.QueryContext(ctx, "SELECT "+plan.RowHash(s)+" FROM "+plan.table(s))
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var h string
			if err := rows.Scan(&h); err != nil {
				t.Fatal(err)
			}
			out = append(out, h)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		slices.Sort(out)
		return out
	}
	uh, dh := hashes(Upstream), hashes(Downstream)
	if len(uh) != len(vals) {
		t.Fatalf("%d hashes for %d rows", len(uh), len(vals))
	}
	if n := len(slices.Compact(slices.Clone(uh))); n != len(vals) {
		t.Errorf("%d distinct hashes for %d distinct rows: the encoding is not injective\n%s", n, len(vals), plan.RowEncoding(Upstream))
	}
	if !slices.Equal(uh, dh) {
		t.Errorf("TiDB and MariaDB hash equal rows differently\n%s\n%s", plan.RowEncoding(Upstream), plan.RowEncoding(Downstream))
	}
}
