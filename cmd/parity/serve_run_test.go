package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/daemon"
	"github.com/tidb-parity/parity/internal/testenv"
	"github.com/tidb-parity/parity/internal/tso"
)

// TestServeAppliesReportsStatusAndDrainsOnSIGTERM runs `parity serve` in-process against
// the real servers: it applies a row, `parity status` reads the lag values from the
// status address, and SIGTERM makes it exit cleanly.
func TestServeAppliesReportsStatusAndDrainsOnSIGTERM(t *testing.T) {
	down := testenv.Downstream(t)
	broker := testenv.Kafka(t)
	topic := testenv.NewTopic(t, "serve", 2)
	if _, err := down.Exec("CREATE TABLE kv (id BIGINT PRIMARY KEY, v VARCHAR(32))"); err != nil {
		t.Fatal(err)
	}
	enc, err := open.NewEncoder(open.EncoderConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ts := tso.FromTime(time.Now().Add(-2 * time.Second))
	if err := enc.AppendRow(&open.Event{Kind: open.KindRow, CommitTs: ts, Schema: down.Name, Table: "kv", Op: open.OpInsert,
		Columns: []open.Column{
			{Name: "id", Type: open.TypeLonglong, Flags: open.FlagHandleKey | open.FlagPrimaryKey, Value: int64(1)},
			{Name: "v", Type: open.TypeVarchar, Value: "served"},
		}}); err != nil {
		t.Fatal(err)
	}
	write := func(part int, m open.Message) {
		conn, err := kafka.DialLeader(context.Background(), "tcp", broker, topic, part)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.WriteMessages(kafka.Message{Key: m.Key, Value: m.Value}); err != nil {
			t.Fatal(err)
		}
	}
	write(0, enc.Build()[0])
	for p := 0; p < 2; p++ {
		write(p, enc.EncodeResolved(ts))
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := daemon.DefaultConfig()
	cfg.Changefeed.Brokers = []string{broker}
	cfg.Changefeed.Topics = []string{topic}
	cfg.Downstream.DSN = down.Root
	cfg.Applier.MetaSchema = testenv.UniqueName("pm")
	cfg.Applier.SpillDir = t.TempDir()
	cfg.Status.Addr = addr
	cfg.API.Addr = ""
	cfg.Log.Level = "warn"
	t.Cleanup(func() { _, _ = down.Exec("DROP DATABASE IF EXISTS `" + cfg.Applier.MetaSchema + "`") })
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- runServe(context.Background(), cfg) }()

	deadline := time.Now().Add(60 * time.Second)
	var st daemon.Status
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, _, err = fetchStatus(ctx, addr)
		cancel()
		if err == nil && st.AppliedTs == ts {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not applied within 60s: %+v, %v", st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var v string
	if err := down.QueryRow("SELECT v FROM kv WHERE id=1").Scan(&v); err != nil || v != "served" {
		t.Fatalf("row: %q %v", v, err)
	}
	if st.AppliedLagSeconds < 1 || st.ResolvedTs != ts || len(st.Partitions) != 2 {
		t.Fatalf("status: %+v", st)
	}
	var out bytes.Buffer
	if err := printStatus(&out, st); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"applied checkpoint ts:", "applied lag:", "global resolved ts:", topic} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("parity status output lacks %q:\n%s", want, out.String())
		}
	}

	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve after SIGTERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not exit within 30s of SIGTERM")
	}
}
