package checker

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestChunkErrorsPermanent: a chunk whose query fails for good (a missing table, a syntax
// error) fails the run at once, with an error naming the table and the chunk, and is not
// compared again; a chunk that times out is (a transient error).
func TestChunkErrorsPermanent(t *testing.T) {
	p := mariaPair(t)
	// Keyless and without an index: one chunk, cut without a query, so the chunk's own
	// checksum query is the first to read the rows.
	p.both(t, "CREATE TABLE pe (v INT)", "INSERT INTO pe VALUES (1)")
	for _, c := range []struct {
		name, where string
		timeout     time.Duration
		want        string // in the error
		attempts    int
	}{
		{"missing table", "v IN (SELECT v FROM no_such_table)", 0, "no_such_table", 1},
		{"syntax", "v IN (SELEC 1)", 0, "syntax", 1},
		{"timeout", "SLEEP(1) = 0", 200 * time.Millisecond, "query_timeout", chunkRetries + 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := p.config(t, "pe")
			cfg.TableConfigs = []TableConfig{{Table: p.up.Name + ".pe", Where: c.where}}
			if c.timeout > 0 {
				cfg.QueryTimeout = c.timeout
			}
			var logs bytes.Buffer
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			d := NewDiff(cfg, nil)
			_, err := d.Run(ctx)
			var re *RunError
			if !errors.As(err, &re) || re.State != RunFailed {
				t.Fatalf("want a failed run, got %v", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, c.want) || !strings.Contains(msg, "pe") || !strings.Contains(msg, "chunk 0") {
				t.Errorf("the error should name the table, the chunk and the cause (%s): %v", c.want, err)
			}
			retries := strings.Count(logs.String(), "chunk failed; retrying")
			if retries != c.attempts-1 || d.Stats().ChunkRetries != int64(retries) {
				t.Errorf("%d retries (stats: %d), want %d:\n%s", retries, d.Stats().ChunkRetries, c.attempts-1, logs.String())
			}
		})
	}
}
