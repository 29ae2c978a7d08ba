package deploy

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const unitPath = "systemd/parity.service"

// unitFile is a parsed systemd unit: section -> key -> every assignment in order.
type unitFile map[string]map[string][]string

func parseUnit(t *testing.T, data []byte) unitFile {
	t.Helper()
	u := unitFile{}
	var section string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			if u[section] == nil {
				u[section] = map[string][]string{}
			}
		default:
			if strings.HasSuffix(line, `\`) {
				t.Fatalf("%s:%d: continuation lines are not used in this unit", unitPath, n)
			}
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: not a key=value in a section: %q", unitPath, n, line)
			}
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			u[section][k] = append(u[section][k], v)
		}
	}
	return u
}

// last is the effective value of a key that takes one value (the last assignment).
func (u unitFile) last(section, key string) (string, bool) {
	v := u[section][key]
	if len(v) == 0 {
		return "", false
	}
	return v[len(v)-1], true
}

// TestSystemdUnitHardening checks the keys that keep parity serve confined: removing or
// weakening any of them fails here.
func TestSystemdUnitHardening(t *testing.T) {
	data, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	u := parseUnit(t, data)
	svc := "Service"
	want := map[string]string{
		"ProtectSystem":            "strict",
		"NoNewPrivileges":          "yes",
		"ProtectHome":              "yes",
		"PrivateTmp":               "yes",
		"PrivateDevices":           "yes",
		"ProtectKernelTunables":    "yes",
		"ProtectKernelModules":     "yes",
		"ProtectControlGroups":     "yes",
		"RestrictNamespaces":       "yes",
		"RestrictSUIDSGID":         "yes",
		"LockPersonality":          "yes",
		"MemoryDenyWriteExecute":   "yes",
		"SystemCallArchitectures":  "native",
		"Restart":                  "on-failure",
		"ExecReload":               "/bin/kill -HUP $MAINPID",
		"RestartPreventExitStatus": "2",
	}
	for k, v := range want {
		if got, ok := u.last(svc, k); !ok || got != v {
			t.Errorf("[Service] %s = %q (set: %v), want %q", k, got, ok, v)
		}
	}

	// A user of its own: DynamicUser, or a named user that is not root.
	dyn, _ := u.last(svc, "DynamicUser")
	user, _ := u.last(svc, "User")
	if dyn != "yes" && (user == "" || user == "root" || user == "0") {
		t.Errorf("[Service] needs DynamicUser=yes or a dedicated User=, got DynamicUser=%q User=%q", dyn, user)
	}
	// No capabilities at all: the last CapabilityBoundingSet= is empty and nothing
	// is granted as ambient.
	if v, ok := u.last(svc, "CapabilityBoundingSet"); !ok || v != "" {
		t.Errorf("[Service] CapabilityBoundingSet = %q (set: %v), want empty", v, ok)
	}
	if v, _ := u.last(svc, "AmbientCapabilities"); v != "" {
		t.Errorf("[Service] AmbientCapabilities = %q, want none", v)
	}

	// Writable places: a state directory, and a cache (or runtime) directory that
	// TMPDIR points at, so the applier's default spill dir ($TMPDIR/parity-spill-<id>)
	// is writable under ProtectSystem=strict and on disk rather than in a private /tmp.
	state, _ := u.last(svc, "StateDirectory")
	if state == "" {
		t.Error("[Service] StateDirectory is not set")
	}
	cache, _ := u.last(svc, "CacheDirectory")
	root := "/var/cache/"
	if cache == "" {
		cache, _ = u.last(svc, "RuntimeDirectory")
		root = "/run/"
	}
	if cache == "" {
		t.Fatal("[Service] neither CacheDirectory nor RuntimeDirectory is set: no writable spill directory")
	}
	tmpdir := ""
	for _, e := range u[svc]["Environment"] {
		for _, kv := range strings.Fields(e) {
			if v, ok := strings.CutPrefix(strings.Trim(kv, `"`), "TMPDIR="); ok {
				tmpdir = v
			}
		}
	}
	if tmpdir != root+cache && !strings.HasPrefix(tmpdir, root+cache+"/") {
		t.Errorf("[Service] Environment TMPDIR = %q, want under %s%s (the spill directory's parent)", tmpdir, root, cache)
	}

	// Network: IP and Unix sockets only.
	fams := strings.Fields(strings.Join(u[svc]["RestrictAddressFamilies"], " "))
	for _, f := range []string{"AF_INET", "AF_INET6"} {
		if !slices.Contains(fams, f) {
			t.Errorf("[Service] RestrictAddressFamilies %v lacks %s", fams, f)
		}
	}
	for _, f := range fams {
		if !slices.Contains([]string{"AF_INET", "AF_INET6", "AF_UNIX"}, f) {
			t.Errorf("[Service] RestrictAddressFamilies allows %s", f)
		}
	}
	if filters := u[svc]["SystemCallFilter"]; len(filters) == 0 || filters[0] != "@system-service" {
		t.Errorf("[Service] SystemCallFilter = %v, want @system-service first", filters)
	}

	if v, _ := u.last(svc, "LimitNOFILE"); v == "" {
		t.Error("[Service] LimitNOFILE is not set")
	} else if n, err := strconv.Atoi(v); err != nil || n < 65536 {
		t.Errorf("[Service] LimitNOFILE = %q, want >= 65536", v)
	}

	// Configuration in /etc/parity/parity.toml; secrets through systemd (PID 1 reads
	// them as root), never in the world-readable config.
	exec, _ := u.last(svc, "ExecStart")
	if !regexp.MustCompile(`^/\S+/parity serve (--config|-c) /etc/parity/parity\.toml$`).MatchString(exec) {
		t.Errorf("[Service] ExecStart = %q, want <abs path>/parity serve --config /etc/parity/parity.toml", exec)
	}
	if len(u[svc]["EnvironmentFile"]) == 0 && len(u[svc]["LoadCredential"]) == 0 {
		t.Error("[Service] neither EnvironmentFile= nor LoadCredential= carries the secrets")
	}
	if v, _ := u.last("Install", "WantedBy"); v != "multi-user.target" {
		t.Errorf("[Install] WantedBy = %q, want multi-user.target", v)
	}
}

// testUnit writes the unit with ExecStart pointing at the built binary (verify wants
// the executable to exist) into a temp dir and returns its path.
func testUnit(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^ExecStart=\S+`)
	if len(re.FindAll(data, -1)) != 1 {
		t.Fatalf("%s: want exactly one ExecStart= line", unitPath)
	}
	data = re.ReplaceAll(data, []byte("ExecStart="+parityBin))
	p := filepath.Join(t.TempDir(), "parity.service")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func systemdAnalyze(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed: the unit is checked by TestSystemdUnitHardening only")
	}
	return p
}

// TestSystemdUnitVerify runs `systemd-analyze verify` on the unit: unknown keys, bad
// values and missing executables are errors.
func TestSystemdUnitVerify(t *testing.T) {
	sa := systemdAnalyze(t)
	unit := testUnit(t)
	out, err := exec.Command(sa, "verify", "--man=no", unit).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	// verify exits 0 on some warnings (an unknown key is only logged): none is accepted.
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if strings.Contains(line, "parity.service") {
			t.Errorf("systemd-analyze verify: %s", line)
		}
	}
}

// TestSystemdUnitSecurity scores the unit with `systemd-analyze security --offline`
// and holds it at 2.0 (lower is more confined, 0.0-10.0; the unit scores 1.2 with
// systemd 252, most of it for having no IP allow list: Kafka and the servers are anywhere).
func TestSystemdUnitSecurity(t *testing.T) {
	sa := systemdAnalyze(t)
	unit := testUnit(t)
	// --threshold is the exposure times ten.
	out, err := exec.Command(sa, "security", "--offline=true", "--no-pager", "--threshold=20", unit).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security: %v (exposure above 2.0)\n%s", err, out)
	}
	t.Logf("%s", lastLine(out))
}

func lastLine(b []byte) string {
	s := strings.TrimSpace(string(b))
	return s[strings.LastIndex(s, "\n")+1:]
}
