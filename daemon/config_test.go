package daemon

import (
	"strings"
	"testing"
)

// validConfig is the smallest configuration the daemon accepts.
func validConfig() Config {
	c := DefaultConfig()
	c.Changefeed.ID = "cf"
	c.Changefeed.Brokers = []string{"127.0.0.1:9092"}
	c.Changefeed.Topics = []string{"t"}
	c.Upstream.DSN = "root@tcp(127.0.0.1:4000)/"
	c.Downstream.DSN = "root@tcp(127.0.0.1:3306)/"
	return c
}

// The configuration is checked once, in Config.check: every part's problems are
// reported together with their key paths, the TLS files are read then, and the parts
// come back checked with TLS applied to the DSNs every part connects with.
func TestCheckOnce(t *testing.T) {
	c := validConfig()
	c.Applier.Workers = -1
	c.Verify.Enabled = true
	c.Verify.MaxViewAge = -1
	c.Bypass.Enabled = true
	c.Bypass.QueryTimeout = -1
	c.Upstream.TLS.CAFile = "/nonexistent/ca.pem"
	c.Log.Format = "xml"
	err := c.Validate()
	if err == nil {
		t.Fatal("Validate accepted a config with five problems")
	}
	for _, key := range []string{"applier.workers", "verify.max-view-age", "bypass.query-timeout", "log.format"} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("Validate does not name %s: %v", key, err)
		}
	}

	c = validConfig()
	c.Upstream.TLS.CAFile = "/nonexistent/ca.pem"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "upstream.tls") {
		t.Errorf("a missing upstream.tls.ca-file: Validate = %v, want an error naming upstream.tls", err)
	}

	c = validConfig()
	c.Upstream.TLS.Enabled = true
	got, p, err := c.check()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(got.Upstream.DSN, "tls=") || p.Verify.UpstreamDSN != got.Upstream.DSN || p.CDC.Upstream.DSN != got.Upstream.DSN {
		t.Errorf("TLS not applied to every part's upstream DSN: config %q, cdc %q, verify %q", got.Upstream.DSN, p.CDC.Upstream.DSN, p.Verify.UpstreamDSN)
	}
	// A checked part is taken as it is: spoiled after the check, it still passes
	// (New would not validate it again) and its DSN is not given TLS twice.
	cdcPart, verifyPart, bypassPart := p.CDC, p.Verify, p.Bypass
	cdcPart.Applier.Workers, verifyPart.MaxViewAge, bypassPart.QueryTimeout = -1, -1, -1
	if cc, err := cdcPart.Checked(); err != nil || cc.Upstream.DSN != p.CDC.Upstream.DSN {
		t.Errorf("cdc part checked again: %v, DSN %q (was %q)", err, cc.Upstream.DSN, p.CDC.Upstream.DSN)
	}
	if _, err := verifyPart.Checked(); err != nil {
		t.Errorf("verify part checked again: %v", err)
	}
	if _, err := bypassPart.Checked(); err != nil {
		t.Errorf("bypass part checked again: %v", err)
	}
	// An unchecked one is validated by the component (New).
	cdcPart = validConfig().Parts().CDC
	cdcPart.Applier.Workers = -1
	if _, err := cdcPart.Checked(); err == nil {
		t.Error("an unchecked cdc part with applier.workers = -1 passed")
	}
}
