package checker

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/internal/testenv"
)

// BenchmarkHashSQL times one full-table checksum query per hash and aggregate variant on
// each server, over a sysbench-shaped table (PARITY_BENCH_ROWS rows, default 200000):
//
//	go test -run '^$' -bench HashSQL -benchtime 1x -v ./checker/
//
// Each variant runs PARITY_BENCH_ROUNDS (default 5) interleaved rounds; the fastest
// counts.
func BenchmarkHashSQL(b *testing.B) {
	n := 200000
	if v, err := strconv.Atoi(os.Getenv("PARITY_BENCH_ROWS")); err == nil && v > 0 {
		n = v
	}
	servers := []struct {
		name string
		db   *testenv.DB
		fl   Flavor
	}{
		{"mariadb", testenv.Downstream(b), flavorMariaDB},
		{"tidb", testenv.Upstream(b), FlavorTiDB},
	}
	ctx := context.Background()
	for _, s := range servers {
		exec(b, s.db.DB, "CREATE TABLE sbtest1 (id INT PRIMARY KEY, k INT NOT NULL, c CHAR(120) NOT NULL, pad CHAR(60) NOT NULL, KEY k_1 (k))")
		for start := 0; start < n; start += 2000 {
			var vals []string
			for i := start; i < min(n, start+2000); i++ {
				vals = append(vals, fmt.Sprintf("(%d,%d,'%011d-%011d-%011d-%011d-%011d-%011d-%011d-%011d-%011d-%011d','%011d-%011d-%011d-%011d-%011d')",
					i+1, i*7%n, i, i*3, i*5, i*7, i*11, i*13, i*17, i*19, i*23, i*29, i*31, i*37, i*41, i*43, i*47))
			}
			exec(b, s.db.DB, "INSERT INTO sbtest1 VALUES "+strings.Join(vals, ","))
		}
		t, err := loadTable(ctx, s.db.DB, s.db.Name, "sbtest1")
		if err != nil {
			b.Fatal(err)
		}
		plan, err := newPlan(t, t, nil)
		if err != nil {
			b.Fatal(err)
		}
		plan.Flavor = [2]Flavor{s.fl, s.fl}
		variants := []struct {
			name string
			sql  string
		}{}
		for _, h := range []Hash{HashSHA1, HashMD5, HashCRC32Pair} {
			plan.Hash = h
			variants = append(variants, struct{ name, sql string }{string(h) + "-sum", plan.ChecksumSQL(upSide, keyRange{})})
			variants = append(variants, struct{ name, sql string }{string(h) + "-xor",
				strings.Replace(plan.ChecksumSQL(upSide, keyRange{}), "IFNULL(SUM(", "IFNULL(BIT_XOR(", 1)})
		}
		variants = append(variants,
			struct{ name, sql string }{"count-only", "SELECT COUNT(*), 0 FROM " + plan.table(upSide)},
			struct{ name, sql string }{"syncdiff-md5", "SELECT COUNT(*), BIT_XOR(CAST(CONV(SUBSTRING(MD5(CONCAT_WS(',', id, k, c, pad, CONCAT(ISNULL(id), ISNULL(k), ISNULL(c), ISNULL(pad)))), 1, 16), 16, 10) AS UNSIGNED) ^ CAST(CONV(SUBSTRING(MD5(CONCAT_WS(',', id, k, c, pad, CONCAT(ISNULL(id), ISNULL(k), ISNULL(c), ISNULL(pad)))), 17, 16), 16, 10) AS UNSIGNED)) FROM " + plan.table(upSide)},
			struct{ name, sql string }{"crc32-xor-bare", "SELECT COUNT(*), BIT_XOR(CRC32(CONCAT_WS('#', id, k, c, pad))) FROM " + plan.table(upSide)},
			// What the injective encoding costs: the same hashes over a plain CONCAT_WS.
			struct{ name, sql string }{"sha1-sum-bare", "SELECT COUNT(*), SUM(CAST(CONV(SUBSTRING(SHA1(CONCAT_WS('#', id, k, c, pad)),1,16),16,10) AS UNSIGNED)) FROM " + plan.table(upSide)},
			struct{ name, sql string }{"crc32-xor-ours", "SELECT COUNT(*), BIT_XOR(CRC32(" + plan.rowEncoding(upSide) + ")) FROM " + plan.table(upSide)},
		)
		// Interleaved rounds, fastest of each: other load on the machine moves single
		// timings a lot.
		rounds := 5
		if v, err := strconv.Atoi(os.Getenv("PARITY_BENCH_ROUNDS")); err == nil && v > 0 {
			rounds = v
		}
		best := make([]time.Duration, len(variants))
		for range rounds {
			for i, v := range variants {
				start := time.Now()
				var cnt int64
				var sum string
				if err := s.db.QueryRowContext(ctx, v.sql).Scan(&cnt, &sum); err != nil {
					b.Fatalf("%s: %v", v.sql, err)
				}
				d := time.Since(start)
				if cnt != int64(n) {
					b.Fatalf("count %d", cnt)
				}
				if best[i] == 0 || d < best[i] {
					best[i] = d
				}
			}
		}
		for i, v := range variants {
			b.Logf("%-8s %-18s %8.0f ms  %9.0f rows/s", s.name, v.name, best[i].Seconds()*1000, float64(n)/best[i].Seconds())
		}
	}
}
