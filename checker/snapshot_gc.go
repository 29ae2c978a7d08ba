package checker

import (
	"context"
	"log/slog"
	"strconv"
	"time"
)

// CheckSnapshotGC refuses an upstream TSO that TiDB's GC has passed, before anything
// reads at it: the error names the TSO, its time and the GC safe point (mysql.tidb's
// tikv_gc_safe_point). It logs until about when GC keeps ts, and warns when that is
// soon. For callers that open a snapshot pair themselves (OpenSnapshotPair does not
// check); a run from DSNs checks its snapshots in the same way. A server that is not
// TiDB, or a safe point it may not read, is left to TiDB's own check (error 8055 when
// the snapshot is set). log may be nil (slog.Default()).
func CheckSnapshotGC(ctx context.Context, upstreamDSN string, ts uint64, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	return checkSnapshotGC(ctx, upstreamDSN, strconv.FormatUint(ts, 10), time.Now(), log)
}
