package bypass

// ddl.go owns the DDL half of detection: parity marks the connection of its own DDL
// (bypasslog.MarkDDLSQL, read by markDDLThreads), and every other DDL of a watched table
// is recorded as a detection of kind ddl on the table it names (ddlStmt).

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/go-mysql-org/go-mysql/replication"

	"github.com/tidb-parity/parity/internal/bypasslog"
)

// ddlStmt finds the table a DDL statement changes: CREATE, ALTER, DROP, TRUNCATE or
// RENAME TABLE, CREATE or DROP INDEX ... ON; the schema is optional, names may be
// quoted with backticks.
var ddlStmt = regexp.MustCompile(`(?is)^\s*(?:/\*.*?\*/\s*)*` +
	`(?:TRUNCATE\s+(?:TABLE\s+)?` +
	`|(?:CREATE|ALTER|DROP|RENAME)\s+(?:OR\s+REPLACE\s+)?(?:TEMPORARY\s+)?(?:(?:ONLINE|OFFLINE|IGNORE)\s+)*TABLE\s+(?:IF\s+(?:NOT\s+)?EXISTS\s+)?` +
	`|(?:CREATE|DROP)\s+(?:(?:ONLINE|OFFLINE)\s+)?(?:(?:UNIQUE|FULLTEXT|SPATIAL)\s+)?INDEX\s+(?:IF\s+(?:NOT\s+)?EXISTS\s+)?\S+\s+ON\s+)` +
	"(?:(`(?:[^`]|``)+`|[0-9A-Za-z_$]+)\\s*\\.\\s*)?(`(?:[^`]|``)+`|[0-9A-Za-z_$]+)")

// ddl records a DDL statement of another connection than parity's as a detection of
// kind ddl on the table it names, when that table is watched. A statement whose table
// cannot be told (another kind of DDL) changes no replicated table's rows or columns
// that way and is not recorded.
func (s *session) ddl(ctx context.Context, cur *txn, schema, q string) {
	m := ddlStmt.FindStringSubmatch(q)
	if m == nil {
		return
	}
	unquote := func(n string) string {
		if strings.HasPrefix(n, "`") {
			return strings.ReplaceAll(n[1:len(n)-1], "``", "`")
		}
		return n
	}
	if m[1] != "" {
		schema = unquote(m[1])
	}
	table := unquote(m[2])
	cur.own = false
	if schema == "" {
		return
	}
	if watched, _ := s.watchedSchema(ctx, schema); !watched { // one it cannot tell is watched
		return
	}
	text := q
	if len(text) > 4096 {
		text = text[:4096] + "…"
	}
	cur.rows = true
	cur.changes = append(cur.changes, change{seq: len(cur.changes), schema: schema, table: table, kind: bypasslog.KindDDL, text: text})
}

// markDDLThreads remembers the connection a marker row of parity's DDL names
// (bypasslog.MarkDDLSQL: writer "ddl", writes the connection id).
func (s *session) markDDLThreads(e *replication.RowsEvent) {
	for _, row := range e.Rows {
		if len(row) < 3 || text(row[0]) != s.d.cfg.Changefeed || text(row[1]) != bypasslog.DDLWriter {
			continue
		}
		if mark, err := strconv.ParseUint(fmt.Sprint(row[2]), 10, 64); err == nil {
			s.ddlThreads[bypasslog.DDLThread(mark)] = true
		} else if mark, err := strconv.ParseInt(fmt.Sprint(row[2]), 10, 64); err == nil { // BIGINT UNSIGNED above 2^63, read signed
			s.ddlThreads[bypasslog.DDLThread(uint64(mark))] = true
		}
	}
}

// text is a row event's string column as text.
func text(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}
