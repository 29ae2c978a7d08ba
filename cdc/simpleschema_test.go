package cdc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/tidb-parity/parity/cdc/simple"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// simpleKV writes simple-protocol records (TiCDC's JSON, as cdc/simple's corpus has them)
// of one table kv (id BIGINT primary key, v VARCHAR, and from schema version 2 on w
// BIGINT) into a feed's topic, with TiCDC's row checksums.
type simpleKV struct {
	f      *feed
	schema string
}

// tableSchema is kv's tableSchema at version (1: id, v; 2: id, v, w).
func (s simpleKV) tableSchema(version uint64) string {
	cols := `{"name":"id","dataType":{"mysqlType":"bigint","charset":"binary","collate":"binary","length":20},"nullable":false,"default":null},` +
		`{"name":"v","dataType":{"mysqlType":"varchar","charset":"utf8mb4","collate":"utf8mb4_bin","length":32},"nullable":true,"default":null}`
	if version >= 2 {
		cols += `,{"name":"w","dataType":{"mysqlType":"bigint","charset":"binary","collate":"binary","length":20},"nullable":true,"default":null}`
	}
	return fmt.Sprintf(`{"schema":%q,"table":"kv","tableID":100,"version":%d,"columns":[%s],`+
		`"indexes":[{"name":"primary","unique":true,"primary":true,"nullable":false,"columns":["id"]}]}`, s.schema, version, cols)
}

// all writes value to every partition, as TiCDC broadcasts DDL, BOOTSTRAP and WATERMARK.
func (s simpleKV) all(value string) {
	s.f.t.Helper()
	for p := 0; p < s.f.parts; p++ {
		s.f.write(p, kafka.Message{Value: []byte(value)})
	}
}

func (s simpleKV) ddl(typ, query string, ts, version uint64) {
	s.f.t.Helper()
	pre := ""
	if version > 1 {
		pre = `,"preTableSchema":` + s.tableSchema(version-1)
	}
	s.all(fmt.Sprintf(`{"version":1,"type":%q,"sql":%q,"commitTs":%d,"buildTs":1,"tableSchema":%s%s}`, typ, query, ts, s.tableSchema(version), pre))
}

func (s simpleKV) bootstrap(version uint64) {
	s.f.t.Helper()
	s.all(`{"version":1,"type":"BOOTSTRAP","commitTs":0,"buildTs":1,"tableSchema":` + s.tableSchema(version) + `}`)
}

func (s simpleKV) watermark(ts uint64) {
	s.f.t.Helper()
	s.all(fmt.Sprintf(`{"version":1,"type":"WATERMARK","commitTs":%d,"buildTs":1}`, ts))
}

// kvRow is one image of a kv row; w < 0 is NULL (and absent before version 2).
type kvRow struct {
	id int64
	v  string
	w  int64
}

// image renders r as a simple row image at version and returns TiCDC's checksum of it:
// CRC-32 over the non-NULL columns in order, BIGINT as uint64 little-endian, VARCHAR as
// a uint32 little-endian length and the bytes (cdc/simple/doc.go).
func (r kvRow) image(version uint64) (string, uint32) {
	var b []byte
	b = binary.LittleEndian.AppendUint64(b, uint64(r.id))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(r.v)))
	b = append(b, r.v...)
	js := fmt.Sprintf(`{"id":"%d","v":%q`, r.id, r.v)
	if version >= 2 {
		if r.w < 0 {
			js += `,"w":null`
		} else {
			b = binary.LittleEndian.AppendUint64(b, uint64(r.w))
			js += `,"w":"` + strconv.FormatInt(r.w, 10) + `"`
		}
	}
	return js + "}", crc32.ChecksumIEEE(b)
}

// row writes an INSERT (old nil), UPDATE or DELETE (new nil) to partition id % parts.
func (s simpleKV) row(ts, version uint64, old, new *kvRow) {
	s.f.t.Helper()
	typ, body := "", ""
	var cur, prev uint32
	id := int64(0)
	if new != nil {
		js, sum := new.image(version)
		body, cur, id = `,"data":`+js, sum, new.id
		typ = "INSERT"
	}
	if old != nil {
		js, sum := old.image(version)
		body, prev, id = body+`,"old":`+js, sum, old.id
		typ = map[bool]string{true: "UPDATE", false: "DELETE"}[new != nil]
	}
	v := fmt.Sprintf(`{"version":1,"database":%q,"table":"kv","tableID":100,"type":%q,"commitTs":%d,"buildTs":1,"schemaVersion":%d%s,`+
		`"checksum":{"version":2,"corrupted":false,"current":%d,"previous":%d}}`, s.schema, typ, ts, version, body, cur, prev)
	s.f.write(int(id)%s.f.parts, kafka.Message{Value: []byte(v)})
}

// TestSimpleSchemasSurviveRestart: a simple-protocol replicator stopped after its
// checkpoint passed a table's CREATE and BOOTSTRAP records (offsets saved beyond them)
// is restarted as a new Replicator, which resumes from those offsets: the next rows of
// the table carry only their schema version, and without the schemas saved in
// <meta>.simple_schema it stopped with simple.ErrNoSchema. The restarted replicator
// decodes them (checksums verified against the restored column order), applies them,
// and learns an ALTER's new version, which a third start restores too; the fallback
// ends with exactly the rows written.
func TestSimpleSchemasSurviveRestart(t *testing.T) {
	down := testenv.Downstream(t)
	f := newFeed(t, 2)
	kv := simpleKV{f: f, schema: down.Name}
	cfg := testConfig(t, f, down)
	cfg.Changefeed.Protocol = ProtocolSimple
	q := ident.Quote(down.Name)

	t1, t2 := f.next(), f.next()
	kv.ddl("CREATE", "CREATE TABLE "+q+".`kv` (`id` BIGINT NOT NULL PRIMARY KEY, `v` VARCHAR(32) NULL)", t1, 1)
	kv.bootstrap(1)
	for id := int64(1); id <= 4; id++ {
		kv.row(t2, 1, nil, &kvRow{id: id, v: "v" + strconv.FormatInt(id, 10), w: -1})
	}
	kv.watermark(t2)
	run := start(t, cfg, nil)
	run.wait(t, t2)
	if err := run.stop(t); err != nil {
		t.Fatalf("first run: %v", err)
	}
	equal(t, "kv after the first run", dump(t, down.DB, down.Name, "kv"), []string{"1|v1", "2|v2", "3|v3", "4|v4"})
	savedSchemas := func() []string {
		t.Helper()
		rows, err := down.Query("SELECT CONCAT(schema_name, '.', table_name, '@', schema_version) FROM "+
			ident.Quote(cfg.Applier.MetaSchema)+"."+simpleSchemaTable+" WHERE changefeed = ? ORDER BY schema_version", cfg.Changefeed.ID)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			out = append(out, strings.TrimPrefix(s, down.Name+"."))
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	equal(t, "saved schemas after the first run", savedSchemas(), []string{"kv@1"})

	// Rows at version 1 beyond the saved offsets, read by a new Replicator.
	t3 := f.next()
	kv.row(t3, 1, &kvRow{id: 1, v: "v1", w: -1}, &kvRow{id: 1, v: "one", w: -1})
	kv.row(t3, 1, &kvRow{id: 2, v: "v2", w: -1}, nil)
	kv.row(t3, 1, nil, &kvRow{id: 5, v: "v5", w: -1})
	kv.watermark(t3)
	run = start(t, cfg, nil)
	run.wait(t, t3)
	equal(t, "kv after the restart", dump(t, down.DB, down.Name, "kv"), []string{"1|one", "3|v3", "4|v4", "5|v5"})

	// A new version from an ALTER, its rows, then a restart and rows at that version.
	t4, t5, t6 := f.next(), f.next(), f.next()
	kv.ddl("ALTER", "ALTER TABLE "+q+".`kv` ADD COLUMN `w` BIGINT NULL", t4, 2)
	kv.row(t5, 2, nil, &kvRow{id: 6, v: "v6", w: 60})
	kv.watermark(t5)
	run.wait(t, t5)
	if err := run.stop(t); err != nil {
		t.Fatalf("second run: %v", err)
	}
	equal(t, "saved schemas after the ALTER", savedSchemas(), []string{"kv@1", "kv@2"})
	kv.row(t6, 2, &kvRow{id: 3, v: "v3", w: -1}, &kvRow{id: 3, v: "three", w: 30})
	kv.row(t6, 2, &kvRow{id: 4, v: "v4", w: -1}, nil)
	kv.watermark(t6)
	run = start(t, cfg, nil)
	run.wait(t, t6)
	equal(t, "kv at the end", dump(t, down.DB, down.Name, "kv"), []string{"1|one|NULL", "3|three|30", "5|v5|NULL", "6|v6|60"})
}

// TestSimpleCorruptedRowStops: a simple-protocol row whose column value was altered by
// one byte on its way (TiCDC's checksum unchanged) stops a running replicator with an
// error naming the Kafka record (topic, partition, offset), the table and the row's key;
// the rows before it are applied, the corrupted one is not (nor anything after it on its
// partition). With applier.dead-letter the record is copied to <meta>.dead_letter with
// the error as evidence, byte for byte, and replication goes on without it.
func TestSimpleCorruptedRowStops(t *testing.T) {
	for _, deadLetter := range []bool{false, true} {
		t.Run(map[bool]string{false: "stops", true: "dead-letter"}[deadLetter], func(t *testing.T) {
			down := testenv.Downstream(t)
			f := newFeed(t, 1)
			kv := simpleKV{f: f, schema: down.Name}
			cfg := testConfig(t, f, down)
			cfg.Changefeed.Protocol = ProtocolSimple
			cfg.Applier.DeadLetter = deadLetter
			q := ident.Quote(down.Name)
			t1, t2, t3 := f.next(), f.next(), f.next()
			kv.ddl("CREATE", "CREATE TABLE "+q+".`kv` (`id` BIGINT NOT NULL PRIMARY KEY, `v` VARCHAR(32) NULL)", t1, 1)
			kv.bootstrap(1)
			kv.row(t2, 1, nil, &kvRow{id: 1, v: "good", w: -1})
			kv.watermark(t2)
			run := start(t, cfg, nil)
			run.wait(t, t2)

			// Offsets on the one partition: DDL 0, BOOTSTRAP 1, row 2, watermark 3, the
			// corrupted row 4.
			js, sum := kvRow{id: 2, v: "payload", w: -1}.image(1)
			js = strings.Replace(js, `"payload"`, `"paYload"`, 1) // one byte altered, the checksum kept
			bad := fmt.Sprintf(`{"version":1,"database":%q,"table":"kv","tableID":100,"type":"INSERT","commitTs":%d,"buildTs":1,"schemaVersion":1,"data":%s,`+
				`"checksum":{"version":2,"corrupted":false,"current":%d,"previous":0}}`, down.Name, t3, js, sum)
			f.write(0, kafka.Message{Value: []byte(bad)})
			kv.row(t3, 1, nil, &kvRow{id: 3, v: "after", w: -1})
			kv.watermark(t3)
			if deadLetter {
				run.wait(t, t3)
				equal(t, "kv", dump(t, down.DB, down.Name, "kv"), []string{"1|good", "3|after"})
				var value []byte
				var msg string
				err := down.QueryRow("SELECT record_value, error FROM "+ident.Quote(cfg.Applier.MetaSchema)+
					".dead_letter WHERE changefeed = ? AND topic = ? AND kafka_partition = 0 AND kafka_offset = 4", cfg.Changefeed.ID, f.topic).Scan(&value, &msg)
				if err != nil {
					t.Fatalf("dead letter of offset 4: %v", err)
				}
				if string(value) != bad {
					t.Errorf("dead letter value:\n%s\nwant the record:\n%s", value, bad)
				}
				for _, want := range []string{"row checksum mismatch", down.Name + ".kv", "id=2", "new image of insert"} {
					if !strings.Contains(msg, want) {
						t.Errorf("dead letter error %q does not name %q", msg, want)
					}
				}
				if st := run.r.Status(); st.Checksums == nil || st.Checksums.Mismatches != 1 || st.DeadLetters != 1 {
					t.Errorf("status after the dead letter: checksums %+v, dead letters %d", st.Checksums, st.DeadLetters)
				}
				return
			}
			err := run.result(t)
			var re *RecordError
			if !errors.As(err, &re) || !errors.Is(err, simple.ErrChecksum) {
				t.Fatalf("the replicator stopped with %v, want a *RecordError wrapping simple.ErrChecksum", err)
			}
			for _, want := range []string{"topic " + f.topic, "partition 0", "offset 4", "table " + down.Name + ".kv", "key (id=2)", "new image of insert", "row checksum mismatch"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %q", err, want)
				}
			}
			if re.Topic != f.topic || re.Partition != 0 || re.Offset != 4 {
				t.Errorf("record error at %s/%d offset %d, want %s/0 offset 4", re.Topic, re.Partition, re.Offset, f.topic)
			}
			equal(t, "kv", dump(t, down.DB, down.Name, "kv"), []string{"1|good"})
			if st := run.r.Status(); st.Checksums == nil || st.Checksums.Mismatches != 1 || st.Checksums.RowsVerified < 1 {
				t.Errorf("checksum counts: %+v", st.Checksums)
			}
		})
	}
}
