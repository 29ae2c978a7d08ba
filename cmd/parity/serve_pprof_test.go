package main

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/daemon"
)

// The profiler is mounted on the status server only when status.pprof is set.
func TestStatusHandlerPprof(t *testing.T) {
	cfg := daemon.DefaultConfig()
	cfg.Changefeed.Brokers = []string{"127.0.0.1:1"}
	cfg.Changefeed.Topics = []string{"t"}
	cfg.Downstream.DSN = "u@tcp(127.0.0.1:1)/"
	r, err := cdc.New(cfg.Parts().CDC, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, on := range []bool{false, true} {
		srv := httptest.NewServer(daemon.Handler(daemon.Components{Replicator: r, Verify: nil}, daemon.BuildInfo{}, on))
		for path, want := range map[string]int{
			"/debug/pprof/":          map[bool]int{false: http.StatusNotFound, true: http.StatusOK}[on],
			"/debug/pprof/goroutine": map[bool]int{false: http.StatusNotFound, true: http.StatusOK}[on],
			"/debug/pprof/cmdline":   map[bool]int{false: http.StatusNotFound, true: http.StatusOK}[on],
			"/status":                http.StatusOK,
		} {
			resp, err := http.Get(srv.URL + path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != want {
				t.Errorf("pprof=%t: GET %s: status %d, want %d", on, path, resp.StatusCode, want)
			}
		}
		srv.Close()
	}
}
