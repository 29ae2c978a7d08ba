package checker

// journal.go is the tracker's journal: it owns storing chunk state transitions and the
// checkpoint, batched off the workers' path. It must not decide the checkpoint (the
// tracker's rule, tally.reach) nor count chunks itself (the tracker does once a batch is
// stored).

import (
	"context"
	"time"

	"github.com/tidb-parity/parity/internal/retry"
)

// journal writes the chunk state transitions (pending → running → done) of a run in
// batches, off the workers' path: a worker queues "started" and "finished" and goes on
// to its next chunk, and one writer stores everything queued meanwhile with a few
// statements (store.commitChunks). Per chunk that replaces two round trips to the meta
// database, each made while the worker's connections sat idle, by a share of one batch
// (docs/diff.md has the measurements).
//
// What a crash may lose is bounded by the queue: a chunk counts as done (in memory, in
// progress reports and in the checkpoint) only once its batch is committed, so a chunk
// whose result was queued but not stored is compared again on resume, like one that was
// in flight. Its differences were stored before its result was queued, and a resumed
// chunk drops the differences of earlier attempts (store.startChunk) before adding its
// own. A chunk is stored as done only after its start was stored (the same or an earlier
// batch), so attempts > 1 still means that the chunk was running when a run stopped.
type journal struct {
	st     *store
	ch     chan journalEntry
	stored map[int]int // table → checkpoint stored by this run (only run touches it)
	// reach is the tracker's checkpoint rule for a table, counting as done the chunks
	// pending says are; committed is told of each stored batch.
	reach     func(table int, pending func(seq int) bool) int
	committed func(updates []chunkUpdate)
}

type journalEntry struct {
	chunk    keyChunk
	finished bool // false: started
	res      chunkResult
}

// newJournal returns a journal queueing up to queue entries, given the checkpoints stored
// so far.
func newJournal(st *store, queue int, checkpoints map[int]int, reach func(int, func(int) bool) int, committed func([]chunkUpdate)) *journal {
	return &journal{st: st, ch: make(chan journalEntry, queue), stored: checkpoints, reach: reach, committed: committed}
}

// started queues the running state of a chunk.
func (j *journal) started(ctx context.Context, c keyChunk) error {
	return j.send(ctx, journalEntry{chunk: c})
}

// finished queues the result of a chunk (its differences are already stored).
func (j *journal) finished(ctx context.Context, c keyChunk, res chunkResult) error {
	return j.send(ctx, journalEntry{chunk: c, finished: true, res: res})
}

func (j *journal) send(ctx context.Context, e journalEntry) error {
	select {
	case j.ch <- e:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// close ends the queue; run stores what is left and returns.
func (j *journal) close() { close(j.ch) }

// maxJournalBatch bounds the chunks stored by one batch (statement size).
const maxJournalBatch = 256

// journalLinger is how long the writer waits after the first entry of a batch for more:
// chunks finish every few milliseconds, and a batch per entry cost two meta statements
// (each a commit) per chunk state, an eighth of parity's CPU on small chunks. A crash
// loses at most this much more work (those chunks are compared again on resume).
const journalLinger = 25 * time.Millisecond

// run stores queued entries until the queue is closed. It is given a context that is
// not cancelled with the run, so the results of chunks that finished before a
// cancellation are still stored (each statement is bounded by the query timeout).
func (j *journal) run(ctx context.Context) error {
	for {
		e, ok := <-j.ch
		if !ok {
			return nil
		}
		batch := []journalEntry{e}
		open := true
		linger := time.NewTimer(journalLinger)
	drain:
		for len(batch) < maxJournalBatch {
			select {
			case e, ok := <-j.ch:
				if !ok {
					open = false
					break drain
				}
				batch = append(batch, e)
			case <-linger.C:
				break drain
			}
		}
		linger.Stop()
		if err := j.commit(ctx, batch); err != nil {
			return err
		}
		if !open {
			return nil
		}
	}
}

// commit stores one batch, then has its finished chunks counted as done.
func (j *journal) commit(ctx context.Context, batch []journalEntry) error {
	type key struct{ table, seq int }
	var updates []chunkUpdate
	index := map[key]int{}
	for _, e := range batch {
		k := key{e.chunk.Table, e.chunk.Seq}
		i, ok := index[k]
		if !ok {
			i = len(updates)
			index[k] = i
			updates = append(updates, chunkUpdate{chunk: e.chunk})
		}
		if e.finished {
			updates[i].finished, updates[i].res = true, e.res
		} else {
			updates[i].started = true
		}
	}
	// The checkpoint each table reaches once this batch is stored: never past a chunk
	// that is not stored as done. Stored only when it moves.
	checkpoints := map[int]int{}
	for _, u := range updates {
		if !u.finished {
			continue
		}
		t := u.chunk.Table
		if _, ok := checkpoints[t]; ok {
			continue
		}
		checkpoints[t] = j.reach(t, func(seq int) bool {
			i, ok := index[key{t, seq}]
			return ok && updates[i].finished
		})
	}
	for t, cp := range checkpoints {
		if cp <= j.stored[t] {
			delete(checkpoints, t)
		}
	}
	// A lost connection to the meta database is retried as a chunk is (the statements
	// are upserts and GREATEST: storing a batch twice only counts one more attempt,
	// which at worst makes a resumed run drop and redo that chunk's differences).
	policy := retry.Policy{MaxRetries: chunkRetries, Backoff: chunkBackoff, MaxBackoff: chunkRetries * chunkBackoff}
	if err := policy.Do(ctx, func(ctx context.Context) error { return j.st.commitChunks(ctx, updates, checkpoints) }, nil); err != nil {
		return err
	}
	for t, cp := range checkpoints {
		j.stored[t] = cp
	}
	j.committed(updates)
	return nil
}
