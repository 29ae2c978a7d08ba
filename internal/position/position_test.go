package position

import (
	"context"
	"regexp"
	"testing"

	"github.com/tidb-parity/parity/internal/testenv"
)

// TestRead reads the fallback MariaDB's GTID position (the test environment runs it with
// a binary log) and sees it move with a write.
func TestRead(t *testing.T) {
	d := testenv.Downstream(t)
	ctx := context.Background()
	before, err := Read(ctx, d.DB)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^mariadb-gtid:\d+-\d+-\d+`).MatchString(before) {
		t.Fatalf("position %q", before)
	}
	if _, err := d.DB.Exec("CREATE TABLE `" + d.Name + "`.t (id INT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	after, err := Read(ctx, d.DB)
	if err != nil || after == before {
		t.Fatalf("position did not move with a write: %q then %q (%v)", before, after, err)
	}
}
