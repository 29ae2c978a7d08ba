package cdc_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/tidb-parity/parity/cdc"
)

// A snapshot point: hold the fallback exactly at upstream TSO T while consistent-snapshot
// transactions are opened, then let replication continue.
func ExampleReplicator_Barrier() {
	cfg := cdc.DefaultConfig()
	cfg.Changefeed.Brokers = []string{"127.0.0.1:9092"}
	cfg.Changefeed.Topics = []string{"ticdc-open"}
	cfg.Downstream.DSN = "root@tcp(127.0.0.1:3306)/"
	r, err := cdc.New(cfg, slog.Default())
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = r.Run(ctx) }()

	const T = 450000000000000000
	err = r.Barrier(ctx, T, func(ctx context.Context) error {
		// Every change with commit ts <= T is committed downstream, nothing newer is:
		// open START TRANSACTION WITH CONSISTENT SNAPSHOT connections here.
		return nil
	})
	fmt.Println(err, r.Status().AppliedTs >= T)
}
