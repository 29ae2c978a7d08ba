package fleet

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeFile(t *testing.T, s string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "fleet.toml")
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const twoMembers = `
[fleet]
name = "estate"
tables = ["shop*.*"]
[[member]]
name = "m1"
addrs = ["127.0.0.1:7001", "127.0.0.1:7011"]
owns = ["shop1.*"]
[[member]]
name = "m2"
addrs = ["127.0.0.1:7002"]
owns = ["shop2.*", "shop3.orders"]
`

// TestLoad: a fleet file over the defaults; every problem of a bad one is reported
// with its key path.
func TestLoad(t *testing.T) {
	cfg, err := Load(writeFile(t, twoMembers))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Fleet.Name != "estate" || len(cfg.Members) != 2 || cfg.Fleet.Failover != DefaultConfig().Fleet.Failover ||
		cfg.Members[0].Addrs[1] != "127.0.0.1:7011" {
		t.Fatalf("loaded %+v", cfg)
	}
	for _, tc := range []struct {
		name, file string
		want       []string
	}{
		{"unknown key", twoMembers + "colour = 1\n", []string{"colour"}},
		{"no members", "[fleet]\nname = \"x\"\n", []string{"member: the fleet has no members"}},
		{"bad member", `
[fleet]
point-attempts = 0
call-timeout = "1ms"
[[member]]
name = "a"
addrs = ["nohost", "127.0.0.1:1"]
owns = ["nodot"]
[[member]]
name = "a"
addrs = ["127.0.0.1:1"]
[[member]]
addrs = ["10.0.0.1:9"]
owns = ["x.*"]
token-file = "/tmp/t"
`, []string{"fleet.point-attempts: 0", "fleet.call-timeout: 1ms", "member[0].addrs[0]: want host:port", "member[0].owns[0]:",
			`member[1].name: "a" is member[0]'s name too`, "member[1].addrs[0]: 127.0.0.1:1 is member a's address too",
			"member[1].owns: must name", "member[2].name: must not be empty", "member[2].addrs[0]: 10.0.0.1:9: refusing to send a bearer token in clear"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(writeFile(t, tc.file))
			if err == nil {
				t.Fatal("loaded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\nlacks %q", err, w)
				}
			}
		})
	}
}

// TestOwners: each selected table has exactly one owner; a table owned by none or by
// two is named, all of them at once.
func TestOwners(t *testing.T) {
	cfg, err := Load(writeFile(t, twoMembers))
	if err != nil {
		t.Fatal(err)
	}
	owner, err := cfg.Owners([]string{"shop1.a", "shop1.b", "shop2.a", "shop3.orders"})
	if err != nil || owner["shop1.b"] != "m1" || owner["shop3.orders"] != "m2" || len(owner) != 4 {
		t.Fatalf("owners %v, %v", owner, err)
	}
	cfg.Members[0].Owns = append(cfg.Members[0].Owns, "shop2.a")
	_, err = cfg.Owners([]string{"shop1.a", "shop2.a", "shop3.items", "shop4.x"})
	var oe *OwnershipError
	if !errors.As(err, &oe) {
		t.Fatalf("err %v", err)
	}
	for _, w := range []string{"table shop3.items is owned by no member", "table shop4.x is owned by no member", "table shop2.a is owned by m1 and m2"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q\nlacks %q", err, w)
		}
	}
}

// TestExampleFile: deploy/fleet.example.toml loads and says what DefaultConfig says.
func TestExampleFile(t *testing.T) {
	cfg, err := Load("../deploy/fleet.example.toml")
	if err != nil {
		t.Fatal(err)
	}
	d := DefaultConfig().Fleet
	if cfg.Fleet.CallTimeout != d.CallTimeout || cfg.Fleet.Failover != d.Failover || cfg.Fleet.PointAttempts != d.PointAttempts ||
		cfg.Fleet.Name != d.Name || strings.Join(cfg.Fleet.Tables, ",") != strings.Join(d.Tables, ",") {
		t.Fatalf("the example's [fleet] %+v differs from the defaults %+v", cfg.Fleet, d)
	}
	if len(cfg.Members) != 2 || len(cfg.Members[0].Addrs) != 2 {
		t.Fatalf("members %+v", cfg.Members)
	}
}
