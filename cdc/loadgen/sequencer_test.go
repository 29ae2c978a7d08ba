package loadgen

import (
	"sync"
	"testing"

	"github.com/tidb-parity/parity/cdc/open"
)

// oracle stands in for TiDB's TSO: strictly increasing, one allocation at a time.
type oracle struct {
	mu        sync.Mutex
	last      uint64
	allocated []uint64 // commit ts handed out, in allocation order
}

func (o *oracle) next(commit bool) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.last++
	if commit {
		o.allocated = append(o.allocated, o.last)
	}
	return o.last
}

func (o *oracle) commitsUpTo(b uint64) []uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []uint64
	for _, c := range o.allocated {
		if c <= b {
			out = append(out, c)
		}
	}
	return out
}

func TestSequencerBoundBelowRegisteredCommit(t *testing.T) {
	s := newSequencer(100)
	tok, lb := s.begin()
	if lb != 100 {
		t.Fatalf("lower bound %d, want the last TSO 100", lb)
	}
	// Another transaction committed at 105 and is handed over.
	tok2, _ := s.begin()
	s.committed(tok2, &txn{commitTs: 105})
	// A fresh TSO 110: the first transaction is still committing, so nothing above its
	// lower bound may be published, including 105.
	txns, bound := s.take(110)
	if len(txns) != 0 || bound != 100 {
		t.Fatalf("took %d transactions with bound %d; want none and bound 100", len(txns), bound)
	}
	s.committed(tok, &txn{commitTs: 108})
	txns, bound = s.take(120)
	if bound != 120 || len(txns) != 2 || txns[0].commitTs != 105 || txns[1].commitTs != 108 {
		t.Fatalf("bound %d, txns %v; want 120 and [105 108] in order", bound, txns)
	}
	// Aborted transactions release the bound.
	tok3, _ := s.begin()
	s.abort(tok3)
	if _, bound = s.take(130); bound != 130 {
		t.Fatalf("bound %d after abort, want 130", bound)
	}
	// A committed transaction above the fresh TSO waits for a later round.
	tok4, _ := s.begin()
	s.committed(tok4, &txn{commitTs: 135})
	if txns, bound = s.take(131); len(txns) != 0 || bound != 131 {
		t.Fatalf("took %d with bound %d; want 0 and 131", len(txns), bound)
	}
	if txns, _ = s.take(140); len(txns) != 1 {
		t.Fatalf("took %d, want the transaction at 135", len(txns))
	}
}

// TestSequencerInvariantConcurrent runs committing workers against a publisher on a
// simulated TSO and checks after every round: every commit ts ≤ the bound has been
// taken (published) by then.
func TestSequencerInvariantConcurrent(t *testing.T) {
	o := &oracle{}
	s := newSequencer(o.next(false))
	const workers, perWorker = 8, 2000
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWorker; i++ {
				tok, lb := s.begin()
				if i%7 == 0 {
					o.next(false) // a COMMIT that failed: no commit ts
					s.abort(tok)
					continue
				}
				c := o.next(true) // COMMIT: the commit ts is allocated after registration
				if c <= lb {
					t.Errorf("commit ts %d not above lower bound %d", c, lb)
				}
				s.committed(tok, &txn{commitTs: c, events: []*open.Event{{Kind: open.KindRow}}})
			}
		}()
	}
	published := map[uint64]bool{}
	var last uint64
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	check := func(final bool) {
		txns, bound := s.take(o.next(false))
		for _, tx := range txns {
			if tx.commitTs <= last && published[tx.commitTs] {
				t.Fatalf("commit ts %d taken twice", tx.commitTs)
			}
			published[tx.commitTs] = true
		}
		for i := 1; i < len(txns); i++ {
			if txns[i-1].commitTs > txns[i].commitTs {
				t.Fatalf("round not in commit-ts order: %d before %d", txns[i-1].commitTs, txns[i].commitTs)
			}
		}
		for _, c := range o.commitsUpTo(bound) {
			if !published[c] {
				t.Fatalf("bound %d passed commit ts %d that was not published", bound, c)
			}
		}
		last = max(last, bound)
	}
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		check(false)
	}
	check(true)
	if got, want := len(published), len(o.commitsUpTo(^uint64(0))); got != want {
		t.Fatalf("published %d transactions, committed %d", got, want)
	}
	if s.inflight() != 0 {
		t.Fatalf("%d transactions still in flight", s.inflight())
	}
}
