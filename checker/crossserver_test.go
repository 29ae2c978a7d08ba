package checker

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
)

// TestChecksumMatchesAcrossServers checks the fast path: for equal data TiDB and MariaDB
// compute the same chunk checksum, row by row, for every type (JSON in the format TiCDC
// writes downstream, which is TiDB's own).
func TestChecksumMatchesAcrossServers(t *testing.T) {
	p := tidbPair(t)
	p.both(t, tortureDDL())
	tidbJSON := `'{"a": {"x": true, "y": null}, "b": [1, 2.5, "s"]}'`
	rows := []map[string]string{
		{"js": tidbJSON}, {}, {"f": "-0.0", "d": "1e-7", "js": "'[]'"}, {"f": "3.4e38", "d": "1.5e300", "dc": "-0.5"},
		{"ch": "''", "vc": "''", "tx": "'NULL'", "bl": "''", "js": "'null'"},
		{"d": "123456789012345678", "f": "1e-20", "tm": "'00:00:00'", "dtm": "'0000-00-00 00:00:00'", "dt": "'0000-00-00'", "yr": "0"},
	}
	for i, o := range rows {
		all := i == 1
		if _, ok := o["js"]; !ok && !all {
			o["js"] = tidbJSON
		}
		execSession(t, &p, true, "SET SESSION sql_mode = '', time_zone = '+00:00'", tortureInsert(i+1, o, all))
		execSession(t, &p, false, "SET SESSION sql_mode = '', time_zone = '+00:00'", tortureInsert(i+1, o, all))
	}
	plan := p.plan(t, "torture", FlavorTiDB)
	for _, digest := range []bool{false, true} {
		if digest {
			// Every string, binary and JSON column enters the row as SHA1 of its text
			// (fitEncoding under a packet nothing fits in), as wide columns do.
			if got := plan.fitEncoding(0); len(got) < 5 {
				t.Fatalf("FitEncoding(0) digested only %v", got)
			}
		}
		for _, pushdown := range []bool{false, true} {
			// TiDB's form in TiDB, then the form pushed down to the coprocessor (TiKV stores).
			plan.Pushdown = [2]bool{pushdown, false}
			matchRows(t, p, plan, len(rows))
		}
	}

	// The benchmark's lower-bound queries run on both servers over every type; the CRC32
	// bound hashes the same encoding, so it agrees across them too.
	for _, b := range []lowerBound{lowerBoundRead, lowerBoundCRC32} {
		var got [2][]string
		for s, db := range []*sql.DB{p.up.DB, p.down.DB} {
			_, out := queryTable(t, db, plan.LowerBoundSQL(pairSide(s), keyRange{}, b))
			if len(out) != 1 {
				t.Fatalf("%s bound on side %d: %d rows", b, s, len(out))
			}
			got[s] = out[0]
		}
		if got[0][0] != fmt.Sprint(len(rows)) || got[1][0] != fmt.Sprint(len(rows)) {
			t.Errorf("%s bound counts: %s and %s, want %d", b, got[0][0], got[1][0], len(rows))
		}
		if b == lowerBoundCRC32 && got[0][1] != got[1][1] {
			t.Errorf("crc32 bound: tidb %s, mariadb %s", got[0][1], got[1][1])
		}
	}
}

// matchRows checks that rows 1..n have the same checksum on both sides.
func matchRows(t *testing.T, p pair, plan *tablePlan, n int) {
	t.Helper()
	ctx := context.Background()
	for id := 1; id <= n; id++ {
		up, down := p.rowChecksums(t, plan, id)
		if up.count != 1 || down.count != 1 || up.sum != down.sum {
			// Show which column differs.
			for _, c := range plan.Columns {
				var a, b string
				q := func(s pairSide) string {
					return fmt.Sprintf("SELECT %s FROM %s WHERE id = %d", plan.encode(s, c), plan.table(s), id)
				}
				_ = p.up.QueryRowContext(ctx, q(upSide)).Scan(&a)
				_ = p.down.QueryRowContext(ctx, q(downSide)).Scan(&b)
				if a != b {
					t.Errorf("row %d column %s: tidb encodes %q, mariadb %q", id, c.Name, a, b)
				}
			}
			t.Errorf("row %d (pushdown %v): tidb (%d, %s), mariadb (%d, %s)", id, plan.Pushdown[upSide], up.count, up.sum, down.count, down.sum)
		}
	}
}

// TestTiDBChecksumForm: TiDB's batch-evaluated checksum query (tidbChecksumSQL) returns
// exactly what the CONV form returns, for both digests, over ranges of rows whose digests
// cover every byte value, and for an empty range.
func TestTiDBChecksumForm(t *testing.T) {
	p := tidbPair(t)
	p.both(t, "CREATE TABLE f (id INT PRIMARY KEY, v VARCHAR(40), n INT)")
	var vals []string
	for i := 1; i <= 3000; i++ {
		vals = append(vals, fmt.Sprintf("(%d, 'v%d', %d)", i, i*7919, i%13))
	}
	exec(t, p.up.DB, "INSERT INTO f VALUES "+strings.Join(vals, ","))
	ctx := context.Background()
	plan := p.plan(t, "f", FlavorTiDB)
	bound := func(id int) chunkBound { return chunkBound{stringValue(fmt.Sprint(id))} }
	for _, h := range []Hash{HashSHA1, HashMD5} {
		plan.Hash = h
		conv := "SELECT COUNT(*), IFNULL(SUM(%s),0) FROM %s%s"
		for _, rng := range []keyRange{{}, {Hi: bound(1)}, {Lo: bound(10), Hi: bound(1500)}, {Lo: bound(5000)}} {
			var got, want checksum
			q := plan.ChecksumSQL(upSide, rng)
			if !strings.Contains(q, "ASCII(SUBSTRING(b,8,1))") {
				t.Fatalf("%s: not the batch form on TiDB: %s", h, q)
			}
			if err := p.up.QueryRowContext(ctx, q).Scan(&got.count, &got.sum); err != nil {
				t.Fatal(err)
			}
			wq := fmt.Sprintf(conv, plan.rowHash(upSide), plan.table(upSide), plan.whereClause(upSide, rng))
			if err := p.up.QueryRowContext(ctx, wq).Scan(&want.count, &want.sum); err != nil {
				t.Fatal(err)
			}
			if got.count != want.count || got.sum != want.sum {
				t.Errorf("%s %v: batch form (%d, %s), CONV form (%d, %s)", h, rng, got.count, got.sum, want.count, want.sum)
			}
		}
		// Bucket checksums (the drill-down of big integer-key ranges): the same per bucket.
		rng := keyRange{Lo: bound(100), Hi: bound(2900)}
		q := plan.bucketChecksumSQL(upSide, rng, "101", "97", false)
		if !strings.Contains(q, "ASCII(SUBSTRING(b,8,1))") {
			t.Fatalf("%s: bucket query not in the batch form on TiDB: %s", h, q)
		}
		k := "FLOOR((CAST(`id` AS DECIMAL(65,0)) - 101) / 97)"
		wq := "SELECT " + k + " AS b, COUNT(*), IFNULL(SUM(" + plan.rowHash(upSide) + "),0) FROM " + plan.table(upSide) +
			plan.whereClause(upSide, rng) + " GROUP BY b ORDER BY b"
		read := func(q string) []string {
			rows, err := p.up.QueryContext(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var out []string
			for rows.Next() {
				var b, n, sum string
				if err := rows.Scan(&b, &n, &sum); err != nil {
					t.Fatal(err)
				}
				out = append(out, b+":"+n+":"+sum)
			}
			return out
		}
		got, want := read(q), read(wq)
		if len(got) != 29 || strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s buckets: batch form %v, CONV form %v", h, got, want)
		}
		// Integer bucket arithmetic (keys >= base): the same buckets.
		if got := read(plan.bucketChecksumSQL(upSide, rng, "101", "97", true)); strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s buckets: integer arithmetic %v, DECIMAL %v", h, got, want)
		}

		// The pushdown form (TiKV stores): the same values, and TiDB hands the whole
		// aggregate to the coprocessor.
		plan.Pushdown = [2]bool{true, false}
		for _, rng := range []keyRange{{}, {Lo: bound(10), Hi: bound(1500)}} {
			q := plan.ChecksumSQL(upSide, rng)
			if strings.Contains(q, "LEFT(") || strings.Contains(q, "ASCII(") {
				t.Fatalf("%s: not the pushdown form: %s", h, q)
			}
			var got, want checksum
			if err := p.up.QueryRowContext(ctx, q).Scan(&got.count, &got.sum); err != nil {
				t.Fatal(err)
			}
			plan.Pushdown = [2]bool{}
			wq := plan.ChecksumSQL(upSide, rng)
			plan.Pushdown = [2]bool{true, false}
			if err := p.up.QueryRowContext(ctx, wq).Scan(&want.count, &want.sum); err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("%s %v: pushdown form (%d, %s), batch form (%d, %s)", h, rng, got.count, got.sum, want.count, want.sum)
			}
			if !copAggregate(t, p.up.DB, q) {
				t.Errorf("%s: TiDB does not push the checksum aggregate down: %s", h, q)
			}
		}
		for _, intMath := range []bool{false, true} {
			pq := plan.bucketChecksumSQL(upSide, rng, "101", "97", intMath)
			if got := read(pq); strings.Join(got, " ") != strings.Join(want, " ") {
				t.Errorf("%s buckets (integer arithmetic %v): pushdown form %v, CONV form %v", h, intMath, got, want)
			}
			if !copAggregate(t, p.up.DB, pq) {
				t.Errorf("%s: TiDB does not push the bucket aggregate down: %s", h, pq)
			}
		}
		plan.Pushdown = [2]bool{}
		if copAggregate(t, p.up.DB, plan.ChecksumSQL(upSide, keyRange{})) {
			t.Errorf("%s: the batch form's aggregate runs in the coprocessor", h)
		}
	}
}

// copAggregate reports whether TiDB's plan for q runs an aggregation with a sum in the
// coprocessor (a cop[tikv] task).
func copAggregate(t *testing.T, db *sql.DB, q string) bool {
	t.Helper()
	_, rows := queryTable(t, db, "EXPLAIN "+q)
	for _, r := range rows {
		l := strings.Join(r, " ")
		if strings.Contains(l, "cop[tikv]") && strings.Contains(l, "funcs:sum(") {
			return true
		}
	}
	return false
}
