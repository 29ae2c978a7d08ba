package main

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
)

// watchAll reads a WatchDiff stream to its end: every message and when it ended.
func watchAll(t *testing.T, stream parityv1.Parity_WatchDiffClient) ([]*parityv1.Diff, time.Time) {
	t.Helper()
	var msgs []*parityv1.Diff
	for {
		d, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return msgs, time.Now()
		}
		if err != nil {
			t.Fatalf("WatchDiff after %d messages: %v", len(msgs), err)
		}
		msgs = append(msgs, d)
	}
}

// TestWatchDiffEndsWithTheRun: WatchDiff sends a run's final message when the run ends,
// not at the next interval: with an interval of 60s (the most it may be), on a live
// daemon, the stream of a full run that takes a second or so ends within a few seconds of
// the run's end time, and the stream of a run cancelled while watched ends as soon as
// the cancel returned, each with the ended run last. The stream once waited out the
// interval (60s) after a run that ended in 0.5s.
func TestWatchDiffEndsWithTheRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	e := startRunbookEnv(t, ctx, "watch_diff", true)
	const slow = 10 * time.Second // far below the 60s interval, far above a prompt end
	minute := durationpb.New(time.Minute)

	// A full run, watched from its start.
	d, err := e.client.StartDiff(ctx, &parityv1.StartDiffRequest{Scope: "full"})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := e.client.WatchDiff(ctx, &parityv1.WatchDiffRequest{Name: d.GetName(), Interval: minute})
	if err != nil {
		t.Fatal(err)
	}
	msgs, streamEnd := watchAll(t, stream)
	last := msgs[len(msgs)-1]
	if last.GetState() != parityv1.DiffState_DIFF_STATE_DONE || last.GetResult() != parityv1.DiffResult_DIFF_RESULT_EQUAL || last.GetEndTime() == nil {
		t.Fatalf("WatchDiff's last message: %v", last)
	}
	runTook := last.GetEndTime().AsTime().Sub(last.GetCreateTime().AsTime())
	late := streamEnd.Sub(last.GetEndTime().AsTime())
	t.Logf("full run %s: %d messages, ran %v, the stream ended %v after the run", last.GetRunId(), len(msgs), runTook.Round(time.Millisecond), late.Round(time.Millisecond))
	if len(msgs) < 2 {
		t.Errorf("WatchDiff sent %d messages, want the run at once and at its end", len(msgs))
	}
	if late > slow {
		t.Errorf("WatchDiff's stream ended %v after the run ended (interval 60s), want within a few seconds", late)
	}

	// A run slowed to 50 rows/s, cancelled while watched.
	d, err = e.client.StartDiff(ctx, &parityv1.StartDiffRequest{Scope: "full", Options: &parityv1.DiffOptions{MaxRowsPerSecond: 50}})
	if err != nil {
		t.Fatal(err)
	}
	stream, err = e.client.WatchDiff(ctx, &parityv1.WatchDiffRequest{Name: d.GetName(), Interval: minute})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if isEnded(first.GetState()) {
		t.Fatalf("the slowed run ended before it was cancelled: %v", first)
	}
	if _, err := e.client.CancelDiff(ctx, &parityv1.CancelDiffRequest{Name: d.GetName()}); err != nil {
		t.Fatal(err)
	}
	cancelled := time.Now()
	msgs, streamEnd = watchAll(t, stream)
	if len(msgs) == 0 {
		t.Fatal("WatchDiff sent nothing after the first message: want the cancelled run")
	}
	last = msgs[len(msgs)-1]
	if last.GetState() != parityv1.DiffState_DIFF_STATE_CANCELLED {
		t.Fatalf("WatchDiff's last message: %v, want the run cancelled", last)
	}
	late = streamEnd.Sub(cancelled)
	t.Logf("cancelled run %s: the stream ended %v after the cancel returned", last.GetRunId(), late.Round(time.Millisecond))
	if late > slow {
		t.Errorf("WatchDiff's stream ended %v after the run was cancelled (interval 60s), want within a few seconds", late)
	}
}
