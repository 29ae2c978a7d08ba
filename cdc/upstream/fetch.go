package upstream

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/ident"
)

// Querier runs a read query.
type Querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

var (
	_ Querier = (*sql.DB)(nil)
	_ Querier = (*sql.Conn)(nil)
	_ Querier = (*sql.Tx)(nil)
)

// ErrRowNotFound is returned by FetchRow when no row has the key.
var ErrRowNotFound = errors.New("row not found")

// FetchRow reads the row of t whose handle-key columns equal those in key (a row image
// that holds at least the handle-key columns, such as a handle-key-only event's) and
// returns its full image as TiCDC would have sent it. q reads at the snapshot the caller
// wants (a session with @@tidb_snapshot set).
func FetchRow(ctx context.Context, q Querier, t *Table, key []open.Column) ([]open.Column, error) {
	if len(t.Handle) == 0 {
		return nil, fmt.Errorf("table %s has no primary key or NOT NULL unique key", t.QualifiedName())
	}
	var where strings.Builder
	args := make([]any, 0, len(t.Handle))
	for i, p := range t.Handle {
		c := t.Columns[p]
		j := columnIndex(key, c.Name)
		if j < 0 {
			return nil, fmt.Errorf("table %s: handle-key column %s is not in the event", t.QualifiedName(), c.Name)
		}
		if key[j].Value == nil {
			return nil, fmt.Errorf("table %s: handle-key column %s is NULL in the event", t.QualifiedName(), c.Name)
		}
		if i > 0 {
			where.WriteString(" AND ")
		}
		where.WriteString(ident.Quote(c.Name))
		if c.Type == open.TypeFloat {
			where.WriteString(" = CAST(? AS FLOAT)") // a FLOAT holds a float32
		} else {
			where.WriteString(" = ?")
		}
		args = append(args, key[j].Value)
	}
	rows, err := q.QueryContext(ctx, "SELECT "+t.SelectList()+" FROM "+t.QualifiedName()+" WHERE "+where.String()+" LIMIT 2", args...)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", t.QualifiedName(), err)
	}
	images, _, err := ScanRows(rows, t, 0)
	if err != nil {
		return nil, err
	}
	switch len(images) {
	case 0:
		return nil, fmt.Errorf("table %s: %w", t.QualifiedName(), ErrRowNotFound)
	case 1:
		return images[0], nil
	}
	return nil, fmt.Errorf("table %s: more than one row has the handle key", t.QualifiedName())
}

func columnIndex(cols []open.Column, name string) int {
	for i, c := range cols {
		if strings.EqualFold(c.Name, name) {
			return i
		}
	}
	return -1
}
