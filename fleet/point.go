package fleet

// point.go owns the fleet point: one TSO T at which every member opens its run's first
// snapshot pair itself, tried again at a newer T when a member had applied past T.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tidb-parity/parity/api/client"
	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
)

// ahead is ts plus attempt n's lead: none for the first, then 100 ms doubling, at most
// 5 s (a TSO's physical part is milliseconds, shifted left by 18 bits).
func ahead(ts uint64, n int) uint64 {
	if n <= 1 {
		return ts
	}
	lead := min(100*time.Millisecond<<(n-2), 5*time.Second)
	return ts + uint64(lead.Milliseconds())<<18
}

// errPassed: a member refused T, having applied past it; the fleet point is tried again
// at a newer T.
var errPassed = errors.New("a member has applied past the fleet point")

// pairPassed reports whether err is a member's refusal of an exact pair.
func pairPassed(err error) bool {
	r, _ := client.ReasonOf(err)
	return r == parityv1.ErrorReason_PAIR_PASSED.String()
}

// atPoint runs attempt at a fresh T until it does not fail with errPassed, at most
// fleet.point-attempts times; it returns the T of the last attempt. T is TiDB's current
// TSO, and after a refusal that TSO plus a lead that doubles from 100 ms (at most 5 s): a
// member whose applier keeps passing T before its barrier is set (a loaded machine, a
// slow member) is given T a little ahead of TiDB. A T ahead of TiDB's clock is a valid
// point: each member holds its applier there when its changefeed resolves T, by which
// time TiDB has passed T, and reads only then.
func (f *Fleet) atPoint(ctx context.Context, attempt func(ctx context.Context, t uint64) error) (uint64, int, error) {
	var t uint64
	for n := 1; ; n++ {
		var err error
		if t, err = f.TSO(ctx); err != nil {
			return 0, n, err
		}
		t = ahead(t, n)
		err = attempt(ctx, t)
		if !errors.Is(err, errPassed) {
			return t, n, err
		}
		f.log.Info("fleet point refused by a member that applied past it; trying a newer TSO", "resolved_ts", t, "attempt", n, "err", err)
		if n >= f.cfg.Fleet.PointAttempts {
			return t, n, fmt.Errorf("no fleet point in %d attempts: %w", n, err)
		}
	}
}
