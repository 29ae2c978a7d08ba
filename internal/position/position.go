// Package position reads a MySQL or MariaDB server's own replication position: its GTID
// state or its binary log file and offset. The applier records it in the ts-map next to
// the upstream TSO the fallback holds, and verification records it for each snapshot
// pair, so other tools (a binlog consumer, a PITR restore, sync-diff-inspector at a fixed
// point) can start from the same point. A leaf package so that both can read it without
// importing each other.
package position

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
)

// Querier is a connection, a pool or a transaction.
type Querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Read returns the server's position: "mariadb-gtid:<gtid_binlog_pos>",
// "mysql-gtid:<gtid_executed>", or "binlog:<file>:<offset>"; "" when the server writes
// no binary log.
func Read(ctx context.Context, q Querier) (string, error) {
	var pos sql.NullString
	if err := q.QueryRowContext(ctx, "SELECT @@gtid_binlog_pos").Scan(&pos); err == nil {
		if pos.String != "" {
			return "mariadb-gtid:" + pos.String, nil
		}
	} else if err := q.QueryRowContext(ctx, "SELECT @@global.gtid_executed").Scan(&pos); err == nil && pos.String != "" {
		return "mysql-gtid:" + strings.ReplaceAll(pos.String, "\n", ""), nil
	}
	rows, err := q.QueryContext(ctx, "SHOW MASTER STATUS")
	if err != nil {
		return "", fmt.Errorf("reading the server's binary log position: %w", err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return "", fmt.Errorf("reading the server's binary log position: %w", err)
	}
	if !rows.Next() {
		return "", rows.Err() // no binary log
	}
	vals := make([]sql.NullString, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := rows.Scan(ptrs...); err != nil {
		return "", fmt.Errorf("reading the server's binary log position: %w", err)
	}
	if len(vals) < 2 {
		return "", fmt.Errorf("reading the server's binary log position: SHOW MASTER STATUS has %d columns", len(vals))
	}
	return "binlog:" + vals[0].String + ":" + vals[1].String, nil
}
