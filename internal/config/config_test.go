package config

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

type inner struct {
	MetaSchema string            `toml:"meta-schema"`
	MaxLag     time.Duration     `toml:"max-lag"`
	Workers    int               `toml:"workers"`
	StartTs    uint64            `toml:"start-ts"`
	On         bool              `toml:"on"`
	Topics     []string          `toml:"topics"`
	SchemaMap  map[string]string `toml:"schema-map"`
	Ratio      float64           `toml:"ratio"`
}

type entry struct {
	TableName string `toml:"table-name"`
}

type root struct {
	Applier inner   `toml:"applier"`
	Tables  []entry `toml:"table"`
	Plain   string  `toml:"plain"`
	Skipped string  `toml:"-"`
}

func TestDecodeStrictAndLegacy(t *testing.T) {
	in := `
plain = "p"
[applier]
meta_schema = "m"
max-lag = "90s"
schema-map = { my_db = "x_y" }
[[table]]
table_name = "t1"
[[table]]
table-name = "t2"
`
	var r root
	if _, err := Decode([]byte(in), &r, Options{}); err == nil || !strings.Contains(err.Error(), "applier.meta_schema: unknown key") {
		t.Fatalf("without Legacy, a snake_case key is unknown: %v", err)
	}
	r = root{Applier: inner{Workers: 8}}
	warnings, err := Decode([]byte(in), &r, Options{Legacy: true})
	if err != nil {
		t.Fatal(err)
	}
	if r.Applier.MetaSchema != "m" || r.Applier.MaxLag != 90*time.Second || r.Applier.Workers != 8 || r.Plain != "p" {
		t.Fatalf("decoded %+v", r)
	}
	if r.Applier.SchemaMap["my_db"] != "x_y" {
		t.Fatalf("a map's user keys were renamed: %v", r.Applier.SchemaMap)
	}
	if len(r.Tables) != 2 || r.Tables[0].TableName != "t1" || r.Tables[1].TableName != "t2" {
		t.Fatalf("tables %+v", r.Tables)
	}
	want := []string{
		"config key applier.meta_schema is deprecated: use applier.meta-schema",
		"config key table.table_name is deprecated: use table.table-name",
	}
	if strings.Join(warnings, "\n") != strings.Join(want, "\n") {
		t.Fatalf("warnings:\n%s\nwant:\n%s", strings.Join(warnings, "\n"), strings.Join(want, "\n"))
	}
	// Unknown keys stay errors with Legacy, each named.
	_, err = Decode([]byte("[applier]\nworkerz = 1\nbogus_key = 2\n"), &r, Options{Legacy: true})
	if err == nil || !strings.Contains(err.Error(), "applier.workerz: unknown key") || !strings.Contains(err.Error(), "applier.bogus_key: unknown key") {
		t.Fatalf("unknown keys: %v", err)
	}
}

func TestSet(t *testing.T) {
	var r root
	for _, tc := range []struct{ key, val string }{
		{"applier.meta-schema", "meta"},
		{"applier.max-lag", "1m30s"},
		{"applier.workers", "6"},
		{"applier.start-ts", "18446744073709551615"},
		{"applier.on", "true"},
		{"applier.topics", "a, b"},
		{"applier.schema-map", "x=y,z=w"},
		{"applier.ratio", "0.5"},
		{"plain", "p"},
	} {
		if err := Set(&r, tc.key, tc.val); err != nil {
			t.Fatalf("Set(%s, %s): %v", tc.key, tc.val, err)
		}
	}
	a := r.Applier
	if a.MetaSchema != "meta" || a.MaxLag != 90*time.Second || a.Workers != 6 || a.StartTs != 1<<64-1 || !a.On ||
		strings.Join(a.Topics, "|") != "a|b" || a.SchemaMap["z"] != "w" || a.Ratio != 0.5 || r.Plain != "p" {
		t.Fatalf("set %+v", r)
	}
	for _, tc := range []struct{ key, val, err string }{
		{"applier.nope", "1", "applier.nope: unknown key"},
		{"plain.x", "1", "plain: not a table"},
		{"applier.workers", "six", "applier.workers: strconv.ParseInt"},
		{"applier.max-lag", "5", "applier.max-lag: time: missing unit"},
		{"applier.schema-map", "novalue", `"novalue" is not key=value`},
		{"table", "x", "cannot set"},
	} {
		if err := Set(&r, tc.key, tc.val); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("Set(%s, %s) = %v, want %q", tc.key, tc.val, err, tc.err)
		}
	}
}

func TestApply(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	fs.Int("workers", 0, "")
	fs.StringSlice("topics", nil, "")
	fs.String("meta-schema", "", "")
	fs.StringToString("schema-map", nil, "")
	fs.StringArray("table", nil, "")
	if err := fs.Parse([]string{"--workers=3", "--topics=a,b", "--topics=c", "--schema-map=p=q", "--table=a,b", "--table=c"}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("X_META", "from-env")
	t.Setenv("X_WORKERS", "9")
	r := root{Applier: inner{MetaSchema: "file"}}
	bindings := []Binding{
		{Flag: "workers", Env: "X_WORKERS", Key: "applier.workers"},
		{Flag: "topics", Key: "applier.topics"},
		{Flag: "meta-schema", Env: "X_META", Key: "applier.meta-schema"},
		{Flag: "schema-map", Key: "applier.schema-map"},
		{Flag: "table", Key: "applier.topics"},
	}
	if err := Apply(&r, fs, bindings); err != nil {
		t.Fatal(err)
	}
	a := r.Applier
	if a.Workers != 3 || strings.Join(a.Topics, "|") != "a,b|c" || a.MetaSchema != "from-env" || a.SchemaMap["p"] != "q" {
		t.Fatalf("applied %+v (flags win over env; env over file; unchanged flags leave values)", a)
	}
	if err := Apply(&r, fs, []Binding{{Flag: "workers", Key: "applier.nope"}}); err == nil || !strings.Contains(err.Error(), "--workers: applier.nope: unknown key") {
		t.Fatalf("bad binding: %v", err)
	}
}
