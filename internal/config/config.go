// Package config turns TOML files, environment variables and flags into a component's
// Config struct, one way for every command: each setting has one key path, the
// kebab-case names of the struct's toml tags joined by dots ("applier.workers"); a file
// sets it by that path, a flag or an environment variable by binding to it, and the gRPC
// API (#18) will set it by the same path.
//
// Files are decoded strictly: an unknown key is an error naming its key path. Keys
// spelled the old snake_case way (parity diff's meta_schema, chunk_target_time) are read
// as their kebab-case key when Options.Legacy is set, each with a warning naming the new
// key, so old files keep working while users move.
//
// It is its own package because cmd (serve, diff) and the API server both map settings
// into cdc.Config and checker.Config; neither of those packages needs to know about
// flags or files.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/go-sql-driver/mysql"
	"github.com/spf13/pflag"
)

// Options tunes Load.
type Options struct {
	// Legacy accepts snake_case spellings of kebab-case keys, with a warning.
	Legacy bool
}

// Load decodes the TOML file at path over dst (a pointer to a struct with toml tags;
// what the file does not set keeps dst's values). It returns a warning for each legacy
// key it accepted, and one when the file holds a secret (see Secrets) and is readable by
// its group or by others.
func Load(path string, dst any, o Options) (warnings []string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	warnings, err = Decode(data, dst, o)
	if err != nil {
		return warnings, fmt.Errorf("config %s: %w", path, err)
	}
	if w := permissionWarning(path, st.Mode(), data); w != "" {
		warnings = append(warnings, w)
	}
	return warnings, nil
}

// permissionWarning is Load's warning for a file with secrets that its group or others
// can read ("" when there is none to give).
func permissionWarning(path string, mode fs.FileMode, data []byte) string {
	if mode.Perm()&0o044 == 0 {
		return ""
	}
	keys := Secrets(data)
	if len(keys) == 0 {
		return ""
	}
	who := "its group"
	switch {
	case mode.Perm()&0o004 != 0 && mode.Perm()&0o040 != 0:
		who = "its group and others"
	case mode.Perm()&0o004 != 0:
		who = "others"
	}
	return fmt.Sprintf("config file %s holds secrets (%s) and is readable by %s (mode %04o): chmod 600 it, or take them from the environment",
		path, strings.Join(keys, ", "), who, mode.Perm())
}

// Secrets returns the key paths of the settings in a TOML document that hold a secret: a
// DSN with a password (a key named dsn or ending in -dsn, as go-sql-driver/mysql reads
// it), or a non-empty value of a key named or ending in password, passwd, secret or
// token. It never returns the values. A document that does not parse holds none.
func Secrets(data []byte) []string {
	var raw map[string]any
	if _, err := toml.Decode(string(data), &raw); err != nil {
		return nil
	}
	var out []string
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				walk(joinKey(prefix, k), e)
			}
		case []map[string]any:
			for _, e := range v {
				walk(prefix, e)
			}
		case []any:
			for _, e := range v {
				walk(prefix, e)
			}
		case string:
			if v != "" && secretKey(prefix, v) && !slices.Contains(out, prefix) {
				out = append(out, prefix)
			}
		}
	}
	walk("", raw)
	sort.Strings(out)
	return out
}

func joinKey(prefix, k string) string {
	if prefix == "" {
		return k
	}
	return prefix + "." + k
}

// secretKey tells whether the string value v at key path path is a secret.
func secretKey(path, v string) bool {
	name := strings.ToLower(path[strings.LastIndex(path, ".")+1:])
	name = strings.ReplaceAll(name, "_", "-")
	for _, s := range []string{"password", "passwd", "secret", "token"} {
		if name == s || strings.HasSuffix(name, "-"+s) {
			return true
		}
	}
	if name == "dsn" || strings.HasSuffix(name, "-dsn") {
		mc, err := mysql.ParseDSN(v)
		return err == nil && mc.Passwd != ""
	}
	return false
}

// Decode is Load on the file's contents.
func Decode(data []byte, dst any, o Options) (warnings []string, err error) {
	if o.Legacy {
		var raw map[string]any
		if _, err := toml.Decode(string(data), &raw); err != nil {
			return nil, err
		}
		warnings = renameLegacy(raw, reflect.TypeOf(dst).Elem(), "")
		if len(warnings) > 0 {
			var buf bytes.Buffer
			if err := toml.NewEncoder(&buf).Encode(raw); err != nil {
				return warnings, fmt.Errorf("re-encoding: %w", err)
			}
			data = buf.Bytes()
		}
	}
	md, err := toml.Decode(string(data), dst)
	if err != nil {
		return warnings, err
	}
	if und := md.Undecoded(); len(und) > 0 {
		var errs []error
		for _, k := range und {
			errs = append(errs, fmt.Errorf("%s: unknown key", k.String()))
		}
		return warnings, errors.Join(errs...)
	}
	return warnings, nil
}

// renameLegacy renames, in place, every key of raw (a decoded TOML table for struct type
// t) that is the snake_case spelling of a field's kebab-case key. Maps of user data
// (map-typed fields) are left alone.
func renameLegacy(raw map[string]any, t reflect.Type, prefix string) []string {
	var warnings []string
	fields := tomlFields(t)
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		name := k
		if _, ok := fields[k]; !ok && strings.Contains(k, "_") {
			if kebab := strings.ReplaceAll(k, "_", "-"); kebab != k {
				if _, ok := fields[kebab]; ok {
					if _, taken := raw[kebab]; !taken {
						raw[kebab] = raw[k]
						delete(raw, k)
						name = kebab
						warnings = append(warnings, fmt.Sprintf("config key %s%s is deprecated: use %s%s", prefix, k, prefix, kebab))
					}
				}
			}
		}
		f, ok := fields[name]
		if !ok {
			continue // Decode reports it as unknown
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch v := raw[name].(type) {
		case map[string]any:
			if ft.Kind() == reflect.Struct {
				warnings = append(warnings, renameLegacy(v, ft, prefix+name+".")...)
			}
		case []map[string]any:
			if ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct {
				for _, e := range v {
					warnings = append(warnings, renameLegacy(e, ft.Elem(), prefix+name+".")...)
				}
			}
		}
	}
	return warnings
}

// tomlFields returns a struct type's fields by TOML key.
func tomlFields(t reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	if t.Kind() != reflect.Struct {
		return out
	}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name := f.Name
		if tag, ok := f.Tag.Lookup("toml"); ok {
			name = strings.Split(tag, ",")[0]
		}
		if name == "-" {
			continue
		}
		out[name] = f
	}
	return out
}

// Set assigns value, given as text (as a flag or an environment variable carries it), to
// the setting at key path of dst (a pointer to a struct). Strings, booleans, integers,
// floats, durations ("1m30s"), string lists (comma separated) and string maps
// ("a=b,c=d") are understood.
func Set(dst any, path string, value string) error {
	v, err := field(dst, path)
	if err != nil {
		return err
	}
	if err := setText(v, value); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// SetList assigns a list of strings to the list setting at key path: what a repeatable
// flag carries, item by item (no splitting at commas).
func SetList(dst any, path string, items []string) error {
	v, err := field(dst, path)
	if err != nil {
		return err
	}
	if v.Kind() != reflect.Slice || v.Type().Elem().Kind() != reflect.String {
		return fmt.Errorf("%s: not a list of strings", path)
	}
	out := reflect.MakeSlice(v.Type(), len(items), len(items))
	for i, it := range items {
		out.Index(i).SetString(it)
	}
	v.Set(out)
	return nil
}

// field finds the field at key path in dst (a pointer to a struct).
func field(dst any, path string) (reflect.Value, error) {
	v := reflect.ValueOf(dst)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return v, fmt.Errorf("config: a pointer to a struct is needed, got %T", dst)
	}
	v = v.Elem()
	parts := strings.Split(path, ".")
	for i, p := range parts {
		f, ok := tomlFields(v.Type())[p]
		if !ok {
			return v, fmt.Errorf("%s: unknown key", strings.Join(parts[:i+1], "."))
		}
		v = v.FieldByIndex(f.Index)
		if i < len(parts)-1 && v.Kind() != reflect.Struct {
			return v, fmt.Errorf("%s: not a table", strings.Join(parts[:i+1], "."))
		}
	}
	return v, nil
}

var durationType = reflect.TypeOf(time.Duration(0))

func setText(v reflect.Value, s string) error {
	if v.Type() == durationType {
		d, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		v.SetInt(int64(d))
		return nil
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(s)
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return err
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, err := strconv.ParseInt(s, 10, v.Type().Bits())
		if err != nil {
			return err
		}
		v.SetInt(n)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n, err := strconv.ParseUint(s, 10, v.Type().Bits())
		if err != nil {
			return err
		}
		v.SetUint(n)
	case reflect.Float32, reflect.Float64:
		f, err := strconv.ParseFloat(s, v.Type().Bits())
		if err != nil {
			return err
		}
		v.SetFloat(f)
	case reflect.Slice:
		if v.Type().Elem().Kind() != reflect.String {
			return fmt.Errorf("cannot set a list of %s from text", v.Type().Elem())
		}
		var items []string
		if s != "" {
			items = strings.Split(s, ",")
		}
		out := reflect.MakeSlice(v.Type(), len(items), len(items))
		for i, it := range items {
			out.Index(i).SetString(strings.TrimSpace(it))
		}
		v.Set(out)
	case reflect.Map:
		if v.Type().Key().Kind() != reflect.String || v.Type().Elem().Kind() != reflect.String {
			return fmt.Errorf("cannot set a %s from text", v.Type())
		}
		m := reflect.MakeMap(v.Type())
		s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]") // pflag's StringToString text
		if s != "" {
			for _, kv := range strings.Split(s, ",") {
				k, val, ok := strings.Cut(kv, "=")
				if !ok {
					return fmt.Errorf("%q is not key=value", kv)
				}
				m.SetMapIndex(reflect.ValueOf(strings.TrimSpace(k)).Convert(v.Type().Key()), reflect.ValueOf(strings.TrimSpace(val)).Convert(v.Type().Elem()))
			}
		}
		v.Set(m)
	default:
		return fmt.Errorf("cannot set a %s from text", v.Type())
	}
	return nil
}

// Binding ties a flag or an environment variable to a key path.
type Binding struct {
	Flag string // flag name, or ""
	Env  string // environment variable, or ""
	Key  string // key path
}

// Apply sets, over dst, every bound environment variable that is set and then every
// bound flag the command line changed (flags win). Flags are read as text, so a flag's
// type only has to agree with its key's.
func Apply(dst any, fs *pflag.FlagSet, bindings []Binding) error {
	var errs []error
	for _, b := range bindings {
		if b.Env == "" {
			continue
		}
		if v, ok := os.LookupEnv(b.Env); ok && v != "" {
			if err := Set(dst, b.Key, v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", b.Env, err))
			}
		}
	}
	for _, b := range bindings {
		if b.Flag == "" || fs == nil || !fs.Changed(b.Flag) {
			continue
		}
		f := fs.Lookup(b.Flag)
		var err error
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			err = SetList(dst, b.Key, sv.GetSlice())
		} else {
			err = Set(dst, b.Key, f.Value.String())
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("--%s: %w", b.Flag, err))
		}
	}
	return errors.Join(errs...)
}
