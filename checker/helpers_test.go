package checker

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidb-parity/parity/internal/metaschema"
	"github.com/tidb-parity/parity/internal/testenv"
)

// pair is an upstream and a downstream test database.
type pair struct {
	up, down *testenv.DB
}

// mariaPair uses the peer MariaDB as upstream and the fallback MariaDB as downstream.
func mariaPair(t *testing.T) pair {
	t.Helper()
	return pair{up: testenv.MySQL(t), down: testenv.Downstream(t)}
}

// oldCollationServer serialises the tests on the TiDB without new collations:
// TestSnapshotGC moves its GC safe point.
var oldCollationServer sync.Mutex

// oldCollationTiDB creates a fresh database on the TiDB without new collations and holds
// that server for the test (oldCollationServer).
func oldCollationTiDB(t *testing.T) *testenv.DB {
	t.Helper()
	oldCollationServer.Lock()
	t.Cleanup(oldCollationServer.Unlock)
	return testenv.TiDBOldCollation(t)
}

// tidbPair uses TiDB as upstream and the fallback MariaDB as downstream.
func tidbPair(t *testing.T) pair {
	t.Helper()
	return pair{up: testenv.Upstream(t), down: testenv.Downstream(t)}
}

// fill inserts rows 1..n, row(i) giving each one's VALUES tuple, into table on both sides
// (one statement).
func (p pair) fill(t *testing.T, table string, n int, row func(i int) string) {
	t.Helper()
	vals := make([]string, n)
	for i := range n {
		vals[i] = row(i + 1)
	}
	p.both(t, "INSERT INTO "+table+" VALUES "+strings.Join(vals, ","))
}

func exec(t testing.TB, db *sql.DB, stmts ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, s := range stmts {
		if _, err := db.ExecContext(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// both runs statements on both sides.
func (p pair) both(t *testing.T, stmts ...string) {
	t.Helper()
	exec(t, p.up.DB, stmts...)
	exec(t, p.down.DB, stmts...)
}

// plan loads table on both sides and builds the checksum plan the engine would, with the
// given upstream flavour and a MariaDB downstream.
func (p pair) plan(t *testing.T, table string, upFlavor Flavor) *tablePlan {
	t.Helper()
	ctx := context.Background()
	up, err := loadTable(ctx, p.up.DB, p.up.Name, table)
	if err != nil {
		t.Fatal(err)
	}
	down, err := loadTable(ctx, p.down.DB, p.down.Name, table)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := newPlan(up, down, nil)
	if err != nil {
		t.Fatal(err)
	}
	plan.Flavor = [2]Flavor{upFlavor, flavorMariaDB}
	return plan
}

// rowChecksums returns both sides' chunk checksums (count and sum) of the range
// (id-1, id] of plan's integer key: the row id alone.
func (p pair) rowChecksums(t *testing.T, plan *tablePlan, id int) (up, down checksum) {
	t.Helper()
	ctx := context.Background()
	rng := keyRange{Lo: chunkBound{stringValue(fmt.Sprint(id - 1))}, Hi: chunkBound{stringValue(fmt.Sprint(id))}}
	if err := p.up.QueryRowContext(ctx, plan.ChecksumSQL(upSide, rng)).Scan(&up.count, &up.sum); err != nil {
		t.Fatal(err)
	}
	if err := p.down.QueryRowContext(ctx, plan.ChecksumSQL(downSide, rng)).Scan(&down.count, &down.sum); err != nil {
		t.Fatal(err)
	}
	return up, down
}

func (p pair) config(t *testing.T, tables ...string) Config {
	cfg := DefaultConfig()
	cfg.Upstream.DSN = p.up.DSN
	cfg.Downstream.DSN = p.down.DSN
	for _, tb := range tables {
		cfg.Tables = append(cfg.Tables, p.up.Name+"."+tb)
	}
	if p.up.Name != p.down.Name {
		cfg.Routes = []Route{{From: p.up.Name, To: p.down.Name}}
	}
	cfg.OutputDir = t.TempDir()
	cfg.MinChunkRows = 1
	return cfg
}

func run(t *testing.T, cfg Config) *Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := NewDiff(cfg, nil).Run(ctx)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	return rep
}

func tableReport(t *testing.T, rep *Report, table string) TableReport {
	t.Helper()
	for _, tr := range rep.Tables {
		if tr.Table == table {
			return tr
		}
	}
	t.Fatalf("no report for table %s", table)
	return TableReport{}
}

func readFix(t *testing.T, cfg Config, tr TableReport) string {
	t.Helper()
	if tr.FixSQLFile == "" {
		t.Fatalf("no fix sql file for %s", tr.Table)
	}
	data, err := os.ReadFile(filepath.Join(cfg.OutputDir, tr.FixSQLFile))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// applyFix runs the fix SQL file on the downstream database.
func applyFix(t *testing.T, db *sql.DB, fix string) {
	t.Helper()
	var stmts []string
	for _, line := range strings.Split(fix, "\n") {
		if strings.HasPrefix(line, "--") || strings.TrimSpace(line) == "" {
			continue
		}
		stmts = append(stmts, strings.TrimSuffix(line, ";"))
	}
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, s := range stmts {
		if _, err := conn.ExecContext(context.Background(), s); err != nil {
			t.Fatalf("apply fix %q: %v", s, err)
		}
	}
}

// firstColumn runs query and returns the first column of every row as text.
func firstColumn(t testing.TB, db *sql.DB, query string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func asRunError(err error, target **RunError) bool { return errors.As(err, target) }

// queryTable runs q and returns its column names and every row's values as text (NULL as
// "").
func queryTable(t *testing.T, db *sql.DB, q string) (cols []string, out [][]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rows, err := db.QueryContext(ctx, q)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	cols, err = rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	vals := make([]sql.NullString, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		row := make([]string, len(vals))
		for i, v := range vals {
			row[i] = v.String
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return cols, out
}

// metaTable names a table of the checker's meta schema (the default one) as the
// migrator registered it.
func metaTable(name string) string { return metaschema.Table(DefaultConfig().MetaSchema, name) }
