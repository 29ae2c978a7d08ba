package cdc

import (
	"strings"
	"testing"
)

// TestProtocolValidate: changefeed.protocol takes TiCDC's names; protocols without a
// watermark are refused with the reason; compression is the open protocol's.
func TestProtocolValidate(t *testing.T) {
	for _, tc := range []struct {
		protocol, compression string
		want                  string // substring of the error; "" valid
	}{
		{"open-protocol", "none", ""},
		{"open-protocol", "lz4", ""},
		{"canal-json", "none", ""},
		{"simple", "none", ""},
		{"simple", "lz4", `changefeed.compression: "lz4" applies to the open protocol only`},
		{"avro", "none", `changefeed.protocol: "avro" carries no watermark`},
		{"debezium", "none", `changefeed.protocol: "debezium" carries no watermark`},
		{"canal", "none", `changefeed.protocol: "canal" carries no watermark`},
		{"open", "none", `changefeed.protocol: unknown protocol "open"`},
		{"", "none", "changefeed.protocol: required"},
		{"canal-json", "snappy", `changefeed.compression: "snappy" applies to the open protocol only`},
	} {
		cfg := DefaultConfig()
		cfg.Changefeed.Brokers, cfg.Changefeed.Topics, cfg.Downstream.DSN = []string{"k:9092"}, []string{"t"}, "root@tcp(h:3306)/"
		cfg.Changefeed.Protocol, cfg.Changefeed.Compression = tc.protocol, tc.compression
		err := cfg.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s/%s: %v", tc.protocol, tc.compression, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s/%s: error %v, want %q", tc.protocol, tc.compression, err, tc.want)
		}
	}
	if DefaultConfig().Changefeed.Protocol != ProtocolOpen {
		t.Error("the default protocol is not open-protocol")
	}
}
