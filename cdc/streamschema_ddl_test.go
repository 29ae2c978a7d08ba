package cdc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/cdc/upstream"
)

// TestStreamSchemasDDL: the definitions DDLs leave, version by version, and the flags a
// row gets from them (the handle as TiCDC picks it).
func TestStreamSchemasDDL(t *testing.T) {
	fallbacks := 0
	s := newStreamSchemas(0, func(ctx context.Context, schema, table string, ts uint64) (*upstream.Table, error) {
		fallbacks++
		return upstream.NewTable(schema, table, []upstream.ColumnDef{{Name: "id", DataType: "int"}}, []upstream.IndexDef{{Name: "PRIMARY", Primary: true, Columns: []string{"id"}}})
	})
	ddl := func(ts uint64, q string) {
		t.Helper()
		if err := s.complete(context.Background(), partKey{Topic: "t"}, []open.Event{{Kind: open.KindDDL, CommitTs: ts, Schema: "d", Query: q}}); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// flags returns "name:handle,generated" of the columns a row at ts gets.
	flags := func(table string, ts uint64, cols ...string) string {
		t.Helper()
		ev := open.Event{Kind: open.KindRow, CommitTs: ts, Schema: "d", Table: table, Op: open.OpInsert}
		for _, c := range cols {
			ev.Columns = append(ev.Columns, open.Column{Name: c, Flags: open.FlagHandleKey | open.FlagBinary})
		}
		evs := []open.Event{ev}
		if err := s.complete(context.Background(), partKey{Topic: "t"}, evs); err != nil {
			return "error: " + err.Error()
		}
		var out []string
		for _, c := range evs[0].Columns {
			f := c.Name
			if c.IsHandle() {
				f += "+h"
			}
			if c.IsGenerated() {
				f += "+g"
			}
			if c.Flags&open.FlagUniqueKey != 0 {
				f += "+u"
			}
			out = append(out, f)
		}
		return strings.Join(out, " ")
	}
	ddl(10, "CREATE TABLE `d`.`u` (`a` INT NOT NULL,`b` VARCHAR(8) NOT NULL,`c` INT NULL,`g` BIGINT GENERATED ALWAYS AS(`a`*2) STORED,UNIQUE `uk_c`(`c`),UNIQUE `uk_ab`(`a`, `b`))")
	ddl(20, "ALTER TABLE `d`.`u` ADD COLUMN `z` INT NOT NULL DEFAULT 1 FIRST")
	ddl(30, "ALTER TABLE `d`.`u` ADD UNIQUE INDEX `uk_z`(`z`)")
	ddl(40, "RENAME TABLE `d`.`u` TO `d`.`u2`")
	ddl(50, "ALTER TABLE `d`.`u2` CHANGE COLUMN `z` `zz` BIGINT NOT NULL")
	ddl(60, "ALTER TABLE `d`.`u2` DROP INDEX `uk_z`")
	ddl(70, "DROP TABLE `d`.`u2`")
	ddl(80, "CREATE TABLE `d`.`p` (`id` BIGINT UNSIGNED PRIMARY KEY, `v` INT)")
	ddl(90, "ALTER TABLE `d`.`p` DROP PRIMARY KEY")
	for _, tc := range []struct {
		table string
		ts    uint64
		cols  []string
		want  string
	}{
		// pkNames is empty for u: the NOT NULL unique (a, b) is the handle, not the nullable c.
		{"u", 11, []string{"a", "b", "c", "g"}, "a+h+u b+h+u c+u g+g"},
		{"u", 21, []string{"z", "a", "b", "c", "g"}, "z a+h+u b+h+u c+u g+g"},
		{"u", 31, []string{"z", "a", "b", "c", "g"}, "z+h+u a+u b+u c+u g+g"}, // one column beats two
		{"u", 41, []string{"z"}, "error: row of d.u at commit ts 41: the changefeed dropped or renamed the table at commit ts 40"},
		{"u2", 41, []string{"z", "a"}, "z+h+u a+u"},
		{"u2", 51, []string{"zz", "a"}, "zz+h+u a+u"},
		{"u2", 61, []string{"zz", "a", "b"}, "zz a+h+u b+h+u"},
		{"u2", 51, []string{"z"}, "error: row of d.u2 at commit ts 51 has column z, which the table's definition lacks"},
		{"p", 81, []string{"id", "v"}, "id+h v"},
		{"p", 91, []string{"id", "v"}, "id v"}, // no key left: keyless
	} {
		if got := flags(tc.table, tc.ts, tc.cols...); got != tc.want {
			t.Errorf("%s at %d: %q, want %q", tc.table, tc.ts, got, tc.want)
		}
	}
	if fallbacks != 0 {
		t.Errorf("%d fallback reads for tables the stream defines", fallbacks)
	}
	// A table the stream never defined is read through the fallback (once per DDL epoch).
	if got := flags("old", 100, "id"); got != "id+h" || fallbacks != 1 {
		t.Errorf("undefined table: %q after %d fallback reads", got, fallbacks)
	}
	flags("old", 101, "id")
	if fallbacks != 1 {
		t.Errorf("fallback read again without a DDL: %d", fallbacks)
	}
	// An unparsable DDL is an error naming it.
	err := s.complete(context.Background(), partKey{Topic: "t"}, []open.Event{{Kind: open.KindDDL, CommitTs: 200, Schema: "d", Query: "ALTER TABLE x FROB"}})
	if err == nil || !strings.Contains(err.Error(), "ALTER TABLE x FROB") {
		t.Errorf("unparsable DDL: %v", err)
	}
	// Rows of another partition wait for partition 0 to reach their ts.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- s.complete(ctx, partKey{Topic: "t", Partition: 1}, []open.Event{{Kind: open.KindRow, CommitTs: 1000, Schema: "d", Table: "p", Columns: []open.Column{{Name: "id"}}}})
	}()
	time.Sleep(50 * time.Millisecond) // time to complete it, were it not waiting
	select {
	case err := <-done:
		t.Fatalf("a partition-1 row at ts 1000 was completed before partition 0 reached it: %v", err)
	default:
	}
	s.advance("t", 999)
	s.advance("t", 1000)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	go func() {
		done <- s.complete(ctx, partKey{Topic: "t", Partition: 2}, []open.Event{{Kind: open.KindRow, CommitTs: 2000, Schema: "d", Table: "p", Columns: []open.Column{{Name: "id"}}}})
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("waiting row after cancel: %v", err)
	}
}

// TestStreamSchemasDDLOfUndefinedTable: a DDL of a table the stream has not defined
// (created before the changefeed, or before the checkpoint a restart resumes from)
// starts from the table's definition read just before it (commit ts - 1), so the rows
// after an ADD COLUMN have the column before the DDL ran downstream; a DDL at or below
// the checkpoint that ran (ddl_applied) reads nothing; a definition that already has the
// DDL's effect leaves the rows to read the table again; a table not there either is left
// to the rows' read.
func TestStreamSchemasDDLOfUndefinedTable(t *testing.T) {
	kv := &tableDef{cols: []upstream.ColumnDef{{Name: "id", DataType: "bigint"}, {Name: "v", DataType: "varchar", Nullable: true}},
		idxs: []upstream.IndexDef{{Name: "PRIMARY", Primary: true, Unique: true, Columns: []string{"id"}}}}
	var reads []string
	s := newStreamSchemas(100, func(ctx context.Context, schema, table string, ts uint64) (*upstream.Table, error) {
		return upstream.NewTable(schema, table, kv.cols, kv.idxs) // the fallback's current definition: no DDL run yet
	})
	s.done = map[ddlKey]bool{newDDLKey(100, "ALTER TABLE `d`.`done` ADD COLUMN `x` INT"): true}
	s.defs = func(ctx context.Context, schema, table string, ts uint64) (*tableDef, error) {
		reads = append(reads, fmt.Sprintf("%s.%s@%d", schema, table, ts))
		switch table {
		case "gone":
			return nil, fmt.Errorf("table %s.%s %w", schema, table, upstream.ErrNoTable)
		case "had":
			d := kv.clone()
			d.cols = append(d.cols, upstream.ColumnDef{Name: "w", DataType: "int", Nullable: true})
			return d, nil
		}
		return kv.clone(), nil
	}
	ddl := func(ts uint64, q string) {
		t.Helper()
		if err := s.complete(context.Background(), partKey{Topic: "t"}, []open.Event{{Kind: open.KindDDL, CommitTs: ts, Schema: "d", Query: q}}); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	row := func(table string, ts uint64, cols ...string) error {
		ev := open.Event{Kind: open.KindRow, CommitTs: ts, Schema: "d", Table: table, Op: open.OpInsert}
		for _, c := range cols {
			ev.Columns = append(ev.Columns, open.Column{Name: c})
		}
		return s.complete(context.Background(), partKey{Topic: "t"}, []open.Event{ev})
	}
	ddl(100, "ALTER TABLE `d`.`done` ADD COLUMN `x` INT") // at the checkpoint and ran: nothing read
	ddl(90, "ALTER TABLE `d`.`old` ADD COLUMN `x` INT")   // below the checkpoint: ran
	ddl(110, "ALTER TABLE `d`.`kv` ADD COLUMN `w` INT")   // read at 109, then w added
	ddl(120, "ALTER TABLE `d`.`kv` ADD INDEX `iw`(`w`)")  // defined now: nothing read
	ddl(130, "ALTER TABLE `d`.`had` ADD COLUMN `w` INT")  // the definition read has w already
	ddl(140, "RENAME TABLE `d`.`gone` TO `d`.`gone2`")    // not there
	ddl(150, "CREATE TABLE `d`.`like` LIKE `d`.`model`")  // the model read at 149
	if got, want := strings.Join(reads, " "), "d.kv@109 d.had@129 d.gone@139 d.model@149"; got != want {
		t.Errorf("definitions read: %s, want %s", got, want)
	}
	if err := row("kv", 111, "id", "v", "w"); err != nil {
		t.Errorf("a row after the ADD COLUMN: %v", err)
	}
	if err := row("had", 131, "id", "v", "w"); err == nil || !strings.Contains(err.Error(), "lacks") {
		t.Errorf("a row of a table whose DDL was not applied to the definition read reads the fallback's (no w): %v", err)
	}
	if err := row("like", 151, "id", "v"); err != nil {
		t.Errorf("a row of the table created LIKE the model: %v", err)
	}
	if len(reads) != 4 {
		t.Errorf("rows read definitions: %v", reads)
	}
}
