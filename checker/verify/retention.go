package verify

// retention.go owns the history's retention (verify.history-retention): every
// pruneInterval, the runs that ended before it are deleted with the checker's rows of
// their tables, keeping the newest clean run over verify.tables (freshness after a
// restart starts from it).

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/retry"
)

// pruneInterval spaces the pruning of the history (verify.history-retention).
const pruneInterval = time.Hour

// retain deletes the runs past verify.history-retention now and every pruneInterval
// until ctx ends. A failure is logged and tried again at the next interval.
func (h *history) retain(ctx context.Context, cfg Config, log *slog.Logger) error {
	for {
		h.pruneExpired(ctx, cfg, log)
		if retry.Sleep(ctx, pruneInterval) != nil {
			return nil
		}
	}
}

// pruneExpired deletes the runs that ended more than verify.history-retention ago,
// keeping the newest clean run over verify.tables.
func (h *history) pruneExpired(ctx context.Context, cfg Config, log *slog.Logger) {
	keep := ""
	clean, err := h.lastClean(ctx, cfg.Tables)
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("verification history not pruned", "err", err)
		}
		return
	}
	if clean != nil {
		keep = clean.RunID
	}
	n, err := h.prune(ctx, cfg.MetaSchema, time.Now().Add(-cfg.HistoryRetention), keep)
	if n > 0 {
		log.Info("pruned verification runs past the history's retention", "runs", n, "retention", cfg.HistoryRetention)
	}
	if err != nil && ctx.Err() == nil {
		log.Warn("verification history not pruned", "err", err)
	}
}

// pruneBatch bounds the runs one query of prune selects; prune goes on until none is left.
const pruneBatch = 100

// prune deletes the runs of the changefeed that finished before horizon, except the run
// keep, with the checker runs of their tables (checker.DeleteRun), and returns how many
// runs it deleted. Each table of a run has its own checker run (run.go starts one per
// table and run), so no other run's rows go with them. The history row goes last: a
// prune stopped half-way is finished by the next.
func (h *history) prune(ctx context.Context, metaSchema string, horizon time.Time, keep string) (int, error) {
	total := 0
	for {
		ids, err := h.column(ctx, "SELECT run_id FROM %s."+RunsTable+" WHERE changefeed=? AND state<>? AND finished_at IS NOT NULL AND finished_at < ? AND run_id<>? ORDER BY finished_at LIMIT "+strconv.Itoa(pruneBatch),
			h.changefeed, StateRunning, horizon.UTC(), keep)
		if err != nil {
			return total, fmt.Errorf("listing runs past the history's retention: %w", err)
		}
		for _, id := range ids {
			diffIDs, err := h.column(ctx, "SELECT DISTINCT diff_run_id FROM %s."+TablesTable+" WHERE run_id=? AND diff_run_id<>''", id)
			if err != nil {
				return total, fmt.Errorf("reading the checker runs of run %s: %w", id, err)
			}
			for _, d := range diffIDs {
				dctx, cancel := context.WithTimeout(ctx, h.timeout)
				_, err := checker.DeleteRun(dctx, h.db, metaSchema, d)
				cancel()
				if err != nil {
					return total, fmt.Errorf("pruning run %s: %w", id, err)
				}
			}
			for _, t := range []string{TablesTable, PairsTable, RunsTable} {
				if err := h.exec(ctx, "DELETE FROM %s."+t+" WHERE run_id=?", id); err != nil {
					return total, fmt.Errorf("pruning run %s from %s: %w", id, t, err)
				}
			}
			total++
		}
		if len(ids) < pruneBatch {
			return total, nil
		}
	}
}
