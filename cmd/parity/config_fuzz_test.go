package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/config"
)

// FuzzConfigLoad feeds arbitrary TOML to config.Load into `parity serve`'s and `parity
// diff`'s configurations (seeded with the deploy examples and small documents with
// secrets). Neither load nor Validate may panic; a load error names the file; every
// problem Validate reports starts with a key path of the configuration; a DSN's
// password never appears in an error or in serve's --check-config output.
func FuzzConfigLoad(f *testing.F) {
	for _, p := range []string{"parity.example.toml", "diff.example.toml"} {
		data, err := os.ReadFile(filepath.Join("..", "..", "deploy", p))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		"[upstream]\ndsn = \"u:S3cr3t-fuzz@tcp(127.0.0.1:4000)/\"\n[downstream]\ndsn = \"r:S3cr3t-down@tcp(h:1)/?tls=nope\"\n[changefeed]\nid = \"c\"\nbrokers = [\"b:1\"]\ntopics = [\"t\"]\n",
		"upstream = { dsn = \"u:S3cr3t-x@tcp(bad\" }\ntables = [\"a.b\"]\n",
		"[applier]\ntype-map = { vector = \"NOT A TYPE\" }\n[changefeed]\nschema-map = { a = \"b\" }\ntopic-regex = \"(\"\n",
		"[[table-configs]]\ntable = \"*.*\"\nwhere = \"1=1\"\n[verify]\nenabled = true\n[[verify.schedules]]\nname = \"x\"\ncron = \"bad\"\n",
		"downstream.dsn = 1\nchunk_target_time = \"1s\"\nmeta_schema = \"m\"\n",
		"[changefeed]\nbrokers = [\"b:1\"]\ntopics = [\"t\"]\n[changefeed.tls]\nca-file = \"/nonexistent/ca.pem\"\ninsecure-skip-verify = true\n[changefeed.sasl]\nmechanism = \"plain\"\nusername = \"u\"\npassword = \"S3cr3t-sasl\"\n[downstream]\ndsn = \"u:S3cr3t-d@tcp(h:1)/?tls=true\"\n[downstream.tls]\ncert-file = \"c\"\n[upstream.tls]\nserver-name = \"a b\"\n",
		"[changefeed.sasl]\nmechanism = \"scram-sha-256\"\nusername = \"u\"\npassword = \"S3cr3t-scram\"\n[changefeed]\nbrokers = [\"b:1\"]\ntopics = [\"t\"]\n[downstream]\ndsn = \"u@tcp(h:1)/\"\n",
	} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "fuzz.toml")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		passwords := dsnPasswords(data)

		cfg, err := loadServeConfig(path, discard{})
		if err != nil {
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("serve: the load error does not name the file: %v", err)
			}
		} else {
			checkValidateErr(t, "serve", cfg.Validate(), topKeys(reflect.TypeOf(cfg)), passwords)
			var out strings.Builder
			if err := toml.NewEncoder(&out).Encode(cfg.Redacted()); err != nil {
				t.Fatalf("serve: --check-config cannot encode the config: %v", err)
			}
			if err := cfg.Validate(); err == nil {
				for _, p := range passwords {
					if strings.Contains(out.String(), p) {
						t.Fatalf("serve: --check-config prints the password %q:\n%s", p, out.String())
					}
				}
			}
		}

		dcfg := checker.DefaultConfig()
		if _, err := config.Load(path, &dcfg, config.Options{Legacy: true}); err != nil {
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("diff: the load error does not name the file: %v", err)
			}
			return
		}
		checkValidateErr(t, "diff", dcfg.Validate(), topKeys(reflect.TypeOf(dcfg)), passwords)
	})
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// dsnPasswords returns the values of keys named password (at least 6 bytes, found once
// in data) and the passwords of the DSN-looking strings in data: as
// go-sql-driver/mysql reads them, and the text between the first ':' and the last '@'
// of every TOML string value under a key ending in dsn, when at least 6 bytes long and
// found once in the DSN (else it could appear by chance).
func dsnPasswords(data []byte) []string {
	var raw map[string]any
	if _, err := toml.Decode(string(data), &raw); err != nil {
		return nil
	}
	var out []string
	var walk func(key string, v any)
	walk = func(key string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				walk(k, e)
			}
		case []map[string]any:
			for _, e := range v {
				walk(key, e)
			}
		case string:
			// changefeed.sasl.password (never printed, never in an error)
			if strings.EqualFold(key, "password") && len(v) >= 6 && strings.Count(string(data), v) == 1 {
				out = append(out, v)
			}
			if !strings.HasSuffix(strings.ToLower(key), "dsn") {
				return
			}
			// A password that also appears elsewhere in the DSN (as its database name, say)
			// may be named for that.
			if mc, err := mysql.ParseDSN(v); err == nil && len(mc.Passwd) >= 6 && strings.Count(v, mc.Passwd) == 1 {
				out = append(out, mc.Passwd)
			}
			i, j := strings.Index(v, ":"), strings.LastIndex(v, "@")
			if i >= 0 && j > i+6 && strings.Count(v, v[i+1:j]) == 1 {
				out = append(out, v[i+1:j])
			}
		}
	}
	walk("", raw)
	return out
}

// topKeys returns the top-level TOML keys of a config struct type.
func topKeys(t reflect.Type) []string {
	var keys []string
	for i := 0; i < t.NumField(); i++ {
		if tag := strings.Split(t.Field(i).Tag.Get("toml"), ",")[0]; tag != "" && tag != "-" {
			keys = append(keys, tag)
		}
	}
	return keys
}

// checkValidateErr: every problem in err (errors.Join's leaves) begins with one of keys
// followed by '.', '[' or ':', and none holds a password.
func checkValidateErr(t *testing.T, what string, err error, keys, passwords []string) {
	t.Helper()
	for _, leaf := range joined(err) {
		msg := leaf.Error()
		named := false
		for _, k := range keys {
			if rest, ok := strings.CutPrefix(msg, k); ok && rest != "" && strings.ContainsRune(".[:", rune(rest[0])) {
				named = true
				break
			}
		}
		if !named {
			t.Fatalf("%s: a problem names no key path: %q", what, msg)
		}
		for _, p := range passwords {
			if strings.Contains(msg, p) {
				t.Fatalf("%s: a problem holds the password %q: %q", what, p, msg)
			}
		}
	}
}

// joined flattens errors.Join's tree into its leaves.
func joined(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, joined(e)...)
		}
		return out
	}
	return []error{err}
}
