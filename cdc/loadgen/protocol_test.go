package loadgen

import (
	"strings"
	"testing"

	"github.com/tidb-parity/parity/cdc/open"
)

// TestProtocolConfig: canal-json and simple refuse what only the open protocol has, and
// simple needs a zone name for its TIMESTAMP values.
func TestProtocolConfig(t *testing.T) {
	for _, tc := range []struct {
		protocol, tz string
		enc          func(*open.EncoderConfig)
		want         string // "" accepted, else a part of the error
	}{
		{ProtocolOpen, "+05:30", func(c *open.EncoderConfig) { c.Compression = open.CompressionLZ4 }, ""},
		{ProtocolCanal, "+05:30", nil, ""},
		{ProtocolCanal, "+00:00", func(c *open.EncoderConfig) { c.Compression = open.CompressionLZ4 }, "compression"},
		{ProtocolSimple, "+00:00", func(c *open.EncoderConfig) { c.LargeMessageHandle = open.LargeMessageHandleKeyOnly }, "large-message-handle"},
		{ProtocolSimple, "+05:30", nil, "zone name"},
		{ProtocolSimple, "Asia/Shanghai", nil, ""},
		{"avro", "+00:00", nil, "unknown"},
	} {
		cfg := DefaultConfig()
		cfg.Protocol, cfg.TimeZone = tc.protocol, tc.tz
		if tc.enc != nil {
			tc.enc(&cfg.Encoder)
		}
		err := cfg.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s %s: %v", tc.protocol, tc.tz, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "protocol:")):
			t.Errorf("%s %s: err = %v, want protocol: …%s…", tc.protocol, tc.tz, err, tc.want)
		}
	}
	for tz, want := range map[string]string{"+00:00": "UTC", "UTC": "UTC", "+08:00": "Etc/GMT-8", "-03:00": "Etc/GMT+3", "Asia/Shanghai": "Asia/Shanghai"} {
		loc, err := locationName(tz)
		if err != nil || loc.String() != want {
			t.Errorf("locationName(%q) = %v, %v; want %s", tz, loc, err, want)
		}
	}
}
