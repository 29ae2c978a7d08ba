package metaschema

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

func step(name string, stmts ...string) Step { return Step{Name: name, Stmts: stmts} }

var (
	a1 = step("create a", "CREATE TABLE IF NOT EXISTS %s.a (id INT PRIMARY KEY)")
	a2 = step("add a.x", "ALTER TABLE %s.a ADD COLUMN x INT NULL")
	b1 = step("create b", "CREATE TABLE IF NOT EXISTS %s.b (id INT PRIMARY KEY)")
)

func registry(cs ...Component) *Registry {
	r := NewRegistry()
	for _, c := range cs {
		r.Register(c)
	}
	return r
}

func versions(t *testing.T, db *sql.DB, schema string) string {
	t.Helper()
	rows, err := db.Query("SELECT component, version, name FROM " + ident.Table(schema, VersionTable) + " ORDER BY component, version")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var c, v, n string
		if err := rows.Scan(&c, &v, &n); err != nil {
			t.Fatal(err)
		}
		out = append(out, c+"/"+v+" "+n)
	}
	return strings.Join(out, "; ")
}

func columns(t *testing.T, db *sql.DB, schema, table string) string {
	t.Helper()
	rows, err := db.Query("SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA=? AND TABLE_NAME=? ORDER BY ORDINAL_POSITION", schema, table)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var c string
		_ = rows.Scan(&c)
		out = append(out, c)
	}
	return strings.Join(out, ",")
}

func TestMigrate(t *testing.T) {
	d := testenv.Downstream(t)
	ctx := context.Background()
	schema := d.Name + "_meta"
	t.Cleanup(func() { _, _ = d.DB.Exec("DROP DATABASE IF EXISTS " + ident.Quote(schema)) })

	v1 := registry(Component{Name: "a", Tables: []string{"a"}, Steps: []Step{a1}}, Component{Name: "b", Tables: []string{"b"}, Steps: []Step{b1}})
	if err := v1.Migrate(ctx, d.DB, schema, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if got, want := versions(t, d.DB, schema), "a/1 create a; b/1 create b"; got != want {
		t.Fatalf("versions %q, want %q", got, want)
	}
	// Again: nothing to do.
	if err := v1.Migrate(ctx, d.DB, schema, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// A newer binary adds a step to a.
	v2 := registry(Component{Name: "a", Tables: []string{"a"}, Steps: []Step{a1, a2}}, Component{Name: "b", Tables: []string{"b"}, Steps: []Step{b1}})
	if err := v2.Migrate(ctx, d.DB, schema, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := columns(t, d.DB, schema, "a"); got != "id,x" {
		t.Fatalf("a has columns %s", got)
	}
	// The older binary refuses the newer schema, naming the component and versions.
	err := v1.Migrate(ctx, d.DB, schema, 10*time.Second)
	if !errors.Is(err, ErrNewer) || !strings.Contains(err.Error(), `component "a" at version 2, this binary knows 1`) {
		t.Fatalf("older binary on a newer schema: %v", err)
	}
	// A binary without component b leaves b alone (a program linking only one part).
	onlyA := registry(Component{Name: "a", Tables: []string{"a"}, Steps: []Step{a1, a2}})
	if err := onlyA.Migrate(ctx, d.DB, schema, 10*time.Second); err != nil {
		t.Fatalf("a component this binary does not link: %v", err)
	}
	// A step that ran but was not recorded (a crash between the two) runs again harmlessly.
	if _, err := d.DB.Exec("DELETE FROM " + ident.Table(schema, VersionTable) + " WHERE component='a' AND version=2"); err != nil {
		t.Fatal(err)
	}
	if err := v2.Migrate(ctx, d.DB, schema, 10*time.Second); err != nil {
		t.Fatalf("re-running an unrecorded ALTER: %v", err)
	}
	if got, want := versions(t, d.DB, schema), "a/1 create a; a/2 add a.x; b/1 create b"; got != want {
		t.Fatalf("versions %q, want %q", got, want)
	}
}

// TestMigrateAdoptsLegacyVersions: a schema written before the shared version table keeps
// its per-component table; it is adopted once and only the steps it lacks run.
func TestMigrateAdoptsLegacyVersions(t *testing.T) {
	d := testenv.Downstream(t)
	ctx := context.Background()
	schema := d.Name + "_legacy"
	t.Cleanup(func() { _, _ = d.DB.Exec("DROP DATABASE IF EXISTS " + ident.Quote(schema)) })
	for _, q := range []string{
		"CREATE DATABASE " + ident.Quote(schema),
		"CREATE TABLE " + ident.Table(schema, "old_versions") + " (version INT PRIMARY KEY, applied_at DATETIME(3))",
		"INSERT INTO " + ident.Table(schema, "old_versions") + " VALUES (1, NOW(3))",
		// Version 1 made a with a marker column the new steps must not recreate.
		"CREATE TABLE " + ident.Table(schema, "a") + " (id INT PRIMARY KEY, legacy INT)",
	} {
		if _, err := d.DB.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	seal := []string{
		"CREATE TABLE IF NOT EXISTS %s.old_versions (version INT PRIMARY KEY, applied_at DATETIME(3))",
		"INSERT IGNORE INTO %s.old_versions VALUES (%v, NOW(3))",
	}
	r := registry(Component{Name: "a", Legacy: "old_versions", LegacySeal: seal, Tables: []string{"a"}, Steps: []Step{a1, a2}})
	if err := r.Migrate(ctx, d.DB, schema, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// The legacy table is sealed (a release that reads only it sees a version it does
	// not know), and its own rows are kept.
	var maxV, n int
	if err := d.DB.QueryRow("SELECT MAX(version), COUNT(*) FROM "+ident.Table(schema, "old_versions")).Scan(&maxV, &n); err != nil || maxV != LegacySealVersion || n != 2 {
		t.Fatalf("legacy table after migration: max %d, %d rows (%v); want the seal and version 1", maxV, n, err)
	}
	if got := columns(t, d.DB, schema, "a"); got != "id,legacy,x" {
		t.Fatalf("a has columns %s, want id,legacy,x (step 1 adopted, step 2 applied)", got)
	}
	if got, want := versions(t, d.DB, schema), "a/1 create a; a/2 add a.x"; got != want {
		t.Fatalf("versions %q, want %q", got, want)
	}
	// A legacy table ahead of the binary is refused.
	schema2 := d.Name + "_legacy2"
	t.Cleanup(func() { _, _ = d.DB.Exec("DROP DATABASE IF EXISTS " + ident.Quote(schema2)) })
	for _, q := range []string{
		"CREATE DATABASE " + ident.Quote(schema2),
		"CREATE TABLE " + ident.Table(schema2, "old_versions") + " (version INT PRIMARY KEY)",
		"INSERT INTO " + ident.Table(schema2, "old_versions") + " VALUES (1),(2),(3)",
	} {
		if _, err := d.DB.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Migrate(ctx, d.DB, schema2, 10*time.Second); !errors.Is(err, ErrNewer) {
		t.Fatalf("legacy version 3 with 2 steps known: %v", err)
	}
}

// TestMigrateSealsFreshSchemas: a schema created by this migrator is sealed too, so a
// release from before it does not take an empty legacy table for a schema of its own.
func TestMigrateSealsFreshSchemas(t *testing.T) {
	d := testenv.Downstream(t)
	schema := d.Name + "_fresh"
	t.Cleanup(func() { _, _ = d.DB.Exec("DROP DATABASE IF EXISTS " + ident.Quote(schema)) })
	r := registry(Component{Name: "a", Legacy: "old_versions", Tables: []string{"a"}, Steps: []Step{a1},
		LegacySeal: []string{"CREATE TABLE IF NOT EXISTS %s.old_versions (version INT PRIMARY KEY)", "INSERT IGNORE INTO %s.old_versions VALUES (%v)"}})
	for range 2 {
		if err := r.Migrate(context.Background(), d.DB, schema, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	var v int
	if err := d.DB.QueryRow("SELECT MAX(version) FROM " + ident.Table(schema, "old_versions")).Scan(&v); err != nil || v != LegacySealVersion {
		t.Fatalf("fresh schema's legacy table: %d (%v)", v, err)
	}
	if got, want := versions(t, d.DB, schema), "a/1 create a"; got != want {
		t.Fatalf("versions %q, want %q (the seal is not a version)", got, want)
	}
}

// TestMigrateConcurrently: two binaries starting at once both succeed and every step is
// recorded once.
func TestMigrateConcurrently(t *testing.T) {
	d := testenv.Downstream(t)
	schema := d.Name + "_conc"
	t.Cleanup(func() { _, _ = d.DB.Exec("DROP DATABASE IF EXISTS " + ident.Quote(schema)) })
	r := registry(Component{Name: "a", Tables: []string{"a"}, Steps: []Step{a1, a2}}, Component{Name: "b", Tables: []string{"b"}, Steps: []Step{b1}})
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { errs[i] = r.Migrate(context.Background(), d.DB, schema, 10*time.Second) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got, want := versions(t, d.DB, schema), "a/1 create a; a/2 add a.x; b/1 create b"; got != want {
		t.Fatalf("versions %q, want %q", got, want)
	}
}

func TestRegistry(t *testing.T) {
	r := registry(Component{Name: "a", Tables: []string{"a"}, Steps: []Step{a1}})
	if got := r.Table("m", "a"); got != "`m`.`a`" {
		t.Fatalf("Table = %s", got)
	}
	mustPanic := func(what string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Fatalf("%s: no panic", what)
			}
		}()
		f()
	}
	mustPanic("unregistered table", func() { r.Table("m", "zz") })
	mustPanic("component twice", func() { r.Register(Component{Name: "a"}) })
	mustPanic("table twice", func() { r.Register(Component{Name: "c", Tables: []string{"a"}}) })
	if v := r.Versions(); v["a"] != 1 {
		t.Fatalf("Versions = %v", v)
	}
}
