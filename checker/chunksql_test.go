package checker

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestChunkSQL: the bare loop's entry point plans as a run does and its queries agree
// across TiDB and MariaDB on equal rows, differ on a changed row (checksum and the CRC32
// floor), count equal rows in the read floor, and name what it refuses.
func TestChunkSQL(t *testing.T) {
	p := tidbPair(t)
	p.both(t, "CREATE TABLE cs (id INT PRIMARY KEY, v VARCHAR(20), d DECIMAL(10,2))")
	p.fill(t, "cs", 50, func(i int) string { return fmt.Sprintf("(%d, 'v%d', %d.25)", i, i, i) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	up, err := OpenDSN(ctx, p.up.DSN, 2, "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	down, err := OpenDSN(ctx, p.down.DSN, 2, "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	cs, err := PlanChunkSQL(ctx, up, down, DefaultConfig(), p.up.Name, "cs", p.down.Name, "cs")
	if err != nil {
		t.Fatal(err)
	}
	lo, err := cs.plan.encodeBound(chunkBound{stringValue("10")})
	if err != nil {
		t.Fatal(err)
	}
	hi, err := cs.plan.encodeBound(chunkBound{stringValue("20")})
	if err != nil {
		t.Fatal(err)
	}
	sums := func(q [2]string) (cnt [2]int64, sum [2]string) {
		t.Helper()
		for s, src := range []*DSNSource{up, down} {
			if err := src.DB().QueryRowContext(ctx, q[s]).Scan(&cnt[s], &sum[s]); err != nil {
				t.Fatalf("side %d: %v\n%s", s, err, q[s])
			}
		}
		return cnt, sum
	}
	q, err := cs.Checksum(lo, hi)
	if err != nil {
		t.Fatal(err)
	}
	if cnt, sum := sums(q); cnt != [2]int64{10, 10} || sum[0] != sum[1] {
		t.Fatalf("equal chunk (10,20]: counts %v, sums %v", cnt, sum)
	}
	crc, err := cs.LowerBound("crc32", lo, hi)
	if err != nil {
		t.Fatal(err)
	}
	if _, sum := sums(crc); sum[0] != sum[1] {
		t.Fatalf("equal chunk: crc32 floor sums %v", sum)
	}
	exec(t, p.down.DB, "UPDATE cs SET v = 'changed' WHERE id = 15")
	if cnt, sum := sums(q); cnt != [2]int64{10, 10} || sum[0] == sum[1] {
		t.Fatalf("chunk with a changed row: counts %v, sums %v (want equal counts, different sums)", cnt, sum)
	}
	if _, sum := sums(crc); sum[0] == sum[1] {
		t.Fatalf("chunk with a changed row: crc32 floor sums equal %v", sum)
	}
	whole, err := cs.Checksum("", "")
	if err != nil {
		t.Fatal(err)
	}
	if cnt, _ := sums(whole); cnt != [2]int64{50, 50} {
		t.Fatalf("open range: counts %v, want 50", cnt)
	}
	if _, err := cs.LowerBound("sha256", lo, hi); err == nil || !strings.Contains(err.Error(), "sha256") {
		t.Errorf("LowerBound(sha256) = %v, want an error naming it", err)
	}
	if _, err := cs.Checksum("garbage", hi); err == nil || !strings.Contains(err.Error(), "lo bound") {
		t.Errorf("Checksum(garbage) = %v, want an error naming the lo bound", err)
	}
	if _, err := PlanChunkSQL(ctx, up, down, DefaultConfig(), p.up.Name, "cs", p.down.Name, "nope"); err == nil || !strings.Contains(err.Error(), "missing downstream") {
		t.Errorf("PlanChunkSQL with a missing table = %v, want it named", err)
	}
}
