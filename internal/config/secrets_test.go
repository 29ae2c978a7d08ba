package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

type secretsRoot struct {
	Upstream struct {
		DSN string `toml:"dsn"`
	} `toml:"upstream"`
	Downstream struct {
		DSN string `toml:"dsn"`
	} `toml:"downstream"`
	API struct {
		Token string `toml:"token"`
	} `toml:"api"`
}

// TestPermissionWarning: Load warns, naming the file, the secret keys and who can read
// it, when a file holding a password or a token is readable by its group or others; a
// private file, or a readable one without secrets, gives no warning; the warning never
// holds the secret itself.
func TestPermissionWarning(t *testing.T) {
	const pass = "S3cr3t-perm-7f1c"
	withPass := "[upstream]\ndsn = \"u:" + pass + "@tcp(127.0.0.1:4000)/\"\n[downstream]\ndsn = \"root@tcp(127.0.0.1:3306)/\"\n"
	noPass := "[upstream]\ndsn = \"u@tcp(127.0.0.1:4000)/\"\n[downstream]\ndsn = \"root@tcp(127.0.0.1:3306)/\"\n"
	withToken := "[api]\ntoken = \"tok-" + pass + "\"\n"
	for _, c := range []struct {
		name, body string
		mode       os.FileMode
		want       string // in the warning; "" for none
	}{
		{"password, world readable", withPass, 0o644, "holds secrets (upstream.dsn) and is readable by its group and others (mode 0644)"},
		{"password, group readable", withPass, 0o640, "readable by its group (mode 0640)"},
		{"password, others only", withPass, 0o604, "readable by others (mode 0604)"},
		{"password, private", withPass, 0o600, ""},
		{"token, world readable", withToken, 0o644, "holds secrets (api.token)"},
		{"no secret, world readable", noPass, 0o644, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "parity.toml")
			if err := os.WriteFile(path, []byte(c.body), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, c.mode); err != nil { // not subject to the umask
				t.Fatal(err)
			}
			var r secretsRoot
			warnings, err := Load(path, &r, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if c.want == "" {
				if len(warnings) != 0 {
					t.Fatalf("warnings %q, want none", warnings)
				}
				return
			}
			if len(warnings) != 1 || !strings.Contains(warnings[0], c.want) || !strings.Contains(warnings[0], path) {
				t.Fatalf("warnings %q, want one naming %s and saying %q", warnings, path, c.want)
			}
			if strings.Contains(warnings[0], pass) {
				t.Fatalf("the warning holds the secret: %q", warnings[0])
			}
		})
	}
}

func TestSecrets(t *testing.T) {
	in := `
dsn = "a:b@tcp(h:1)/"
plain = "x"
[upstream]
dsn = "root@tcp(h:1)/"
[downstream]
dsn = "root:pw@tcp(h:1)/"
[kafka.sasl]
password = "p"
user = "u"
[api]
token-file = "/etc/parity/tokens.toml"
[[token]]
name = "ops"
token = "t"
[[token]]
name = "ci"
sha256 = "ab"
[x]
legacy_secret = "s"
empty-password = ""
`
	got := Secrets([]byte(in))
	want := []string{"downstream.dsn", "dsn", "kafka.sasl.password", "token.token", "x.legacy_secret"}
	if !slices.Equal(got, want) {
		t.Fatalf("Secrets = %q, want %q", got, want)
	}
	if got := Secrets([]byte("not = toml = at all")); got != nil {
		t.Fatalf("Secrets of bad TOML = %q", got)
	}
}
