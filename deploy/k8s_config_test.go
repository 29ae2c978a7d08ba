package deploy

// k8s_config_test.go checks the ConfigMap's parity.toml as the pod would start it: through
// `parity serve --check-config` with the Secret's DSNs, against the Deployment's ports,
// volumes and token file. k8s_test.go holds the manifests' loading and the other checks.

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// effectiveConfig is what `parity serve --check-config` prints, the parts checked here.
type effectiveConfig struct {
	Changefeed struct {
		ID string `toml:"id"`
	} `toml:"changefeed"`
	Applier struct {
		MemoryBytes int64  `toml:"memory-bytes"`
		SpillDir    string `toml:"spill-dir"`
	} `toml:"applier"`
	Status struct {
		Addr string `toml:"addr"`
	} `toml:"status"`
	API *apiConfig `toml:"api"`
}

// apiConfig is serve's [api] table (api/README.md).
type apiConfig struct {
	Addr      string `toml:"addr"`
	TokenFile string `toml:"token-file"`
	Insecure  bool   `toml:"insecure"`
	TLS       struct {
		CertFile string `toml:"cert-file"`
		KeyFile  string `toml:"key-file"`
	} `toml:"tls"`
}

// tokenFile mirrors the API's token file (api/README.md, "The token file").
type tokenFile struct {
	Token []struct {
		Name   string `toml:"name"`
		Role   string `toml:"role"`
		Token  string `toml:"token"`
		SHA256 string `toml:"sha256"`
	} `toml:"token"`
}

// checkConfig runs `parity serve --check-config` on file with only the given
// environment and decodes the effective configuration it prints.
func checkConfig(t *testing.T, file string, env map[string]string) (effectiveConfig, string, error) {
	t.Helper()
	args := []string{"serve", "--check-config"}
	if file != "" {
		args = append(args, "--config", file)
	}
	cmd := exec.Command(parityBin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return effectiveConfig{}, stdout.String(), fmt.Errorf("parity %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	var ec effectiveConfig
	_, err := toml.Decode(stdout.String(), &ec)
	return ec, stdout.String(), err
}

// withoutTable removes the TOML table [name] and its sub-tables from doc.
func withoutTable(doc, name string) string {
	var out []string
	skip := false
	for _, line := range strings.Split(doc, "\n") {
		if h := strings.TrimSpace(line); strings.HasPrefix(h, "[") {
			skip = h == "["+name+"]" || strings.HasPrefix(h, "["+name+".") || strings.HasPrefix(h, "[["+name+".")
		}
		if !skip {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// TestK8sConfigMapConfig runs the ConfigMap's parity.toml through `parity serve
// --check-config` with the Secret's DSNs in the environment, as the pod would start,
// and checks it against the Deployment: the listeners on the container's ports and on
// every interface, the spill directory on the spill volume, the tokens file where the
// Secret is mounted, the memory limit above the heap parity allows itself.
func TestK8sConfigMapConfig(t *testing.T) {
	m := loadManifests(t)
	c := parityContainer(t, m.deployment)
	doc, ok := m.configMap.Data["parity.toml"]
	if !ok {
		t.Fatalf("ConfigMap %s has no parity.toml", m.configMap.Name)
	}

	// The container reads --config from the ConfigMap's parity.toml.
	cfgPath := ""
	if i := slices.Index(c.Args, "--config"); i >= 0 && i+1 < len(c.Args) {
		cfgPath = c.Args[i+1]
	}
	vols := map[string]corev1.Volume{}
	for _, v := range m.deployment.Spec.Template.Spec.Volumes {
		vols[v.Name] = v
	}
	mounted := false
	for _, vm := range c.VolumeMounts {
		v := vols[vm.Name]
		if v.ConfigMap == nil || v.ConfigMap.Name != m.configMap.Name {
			continue
		}
		if vm.MountPath == cfgPath && vm.SubPath == "parity.toml" || path.Join(vm.MountPath, "parity.toml") == cfgPath && vm.SubPath == "" {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("args %v: --config %q is not the ConfigMap's parity.toml as mounted", c.Args, cfgPath)
	}

	// The binary under test may predate the [api] table (the gRPC API): then the table
	// is checked only once the binary knows it.
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			env[e.Name] = m.secret.StringData[e.ValueFrom.SecretKeyRef.Key]
			if v, ok := m.secret.Data[e.ValueFrom.SecretKeyRef.Key]; ok {
				env[e.Name] = string(v)
			}
		}
	}
	minimal := filepath.Join(t.TempDir(), "minimal.toml")
	if err := os.WriteFile(minimal, []byte("[changefeed]\nbrokers = [\"kafka:9092\"]\ntopics = [\"t\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, defaults, err := checkConfig(t, minimal, env)
	if err != nil {
		t.Fatal(err)
	}
	apiKnown := strings.Contains(defaults, "\n[api]")
	if !apiKnown {
		t.Logf("this parity has no [api] table yet: checking parity.toml without it")
		doc = withoutTable(doc, "api")
	}
	// The files the config names under /etc/parity come from the pod's Secret volumes:
	// --check-config wants them to exist, so they are staged under a root of the
	// test's (the token file with the Secret's content, the certificates empty: only
	// their presence is checked).
	root := t.TempDir()
	for _, ref := range regexp.MustCompile(`"(/etc/parity/[^"]+)"`).FindAllStringSubmatch(doc, -1) {
		staged := filepath.Join(root, ref[1])
		if err := os.MkdirAll(filepath.Dir(staged), 0o700); err != nil {
			t.Fatal(err)
		}
		content := []byte{}
		if path.Base(ref[1]) == "api-tokens" {
			content = []byte(m.secret.StringData["api-tokens"])
			if v, ok := m.secret.Data["api-tokens"]; ok {
				content = v
			}
		}
		if err := os.WriteFile(staged, content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	doc = strings.ReplaceAll(doc, `"/etc/parity/`, `"`+root+`/etc/parity/`)
	file := filepath.Join(t.TempDir(), "parity.toml")
	if err := os.WriteFile(file, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	ec, out, err := checkConfig(t, file, env)
	if err != nil {
		t.Fatalf("the ConfigMap's parity.toml is not a valid serve config: %v", err)
	}
	// The effective config with the pod's paths again.
	ec = effectiveConfig{}
	if _, err := toml.Decode(strings.ReplaceAll(out, `"`+root+`/etc/parity/`, `"/etc/parity/`), &ec); err != nil {
		t.Fatal(err)
	}

	listen := func(key, addr string, port int) {
		host, p, err := net.SplitHostPort(addr)
		if err != nil || p != fmt.Sprint(port) || (host != "" && host != "0.0.0.0" && host != "::") {
			t.Errorf("%s = %q, want \":%d\" (every interface: the kubelet probes the pod IP)", key, addr, port)
		}
	}
	listen("status.addr", ec.Status.Addr, statusPort)

	mountOf := func(p string) (corev1.VolumeMount, bool) {
		var best corev1.VolumeMount
		for _, vm := range c.VolumeMounts {
			if (p == vm.MountPath || strings.HasPrefix(p, vm.MountPath+"/")) && len(vm.MountPath) > len(best.MountPath) {
				best = vm
			}
		}
		return best, best.Name != ""
	}

	// Spill: a directory below a writable scratch mount (parity removes and re-creates
	// it at start, which a mount point itself does not allow).
	if vm, ok := mountOf(ec.Applier.SpillDir); !ok || vm.ReadOnly || vm.MountPath == ec.Applier.SpillDir ||
		(vols[vm.Name].EmptyDir == nil && vols[vm.Name].PersistentVolumeClaim == nil) {
		t.Errorf("applier.spill-dir %q is not a directory below an emptyDir or PVC mount", ec.Applier.SpillDir)
	}

	// parity caps its heap at max(2 x memory-bytes + 32 MiB, 128 MiB): the limit must leave room.
	heap := max(2*ec.Applier.MemoryBytes+32<<20, 128<<20)
	if lim, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok || lim.Cmp(*resource.NewQuantity(heap+128<<20, resource.BinarySI)) < 0 {
		t.Errorf("memory limit %s leaves less than 128 MiB above parity's heap cap %d bytes (applier.memory-bytes %d)",
			lim.String(), heap, ec.Applier.MemoryBytes)
	}

	if apiKnown {
		if ec.API == nil {
			t.Fatal("check-config printed no [api] table")
		}
	} else {
		// Still check the [api] table against the Deployment, decoded from the ConfigMap.
		var raw effectiveConfig
		if _, err := toml.Decode(m.configMap.Data["parity.toml"], &raw); err != nil {
			t.Fatal(err)
		}
		ec.API = raw.API
	}
	if ec.API == nil {
		t.Fatal("the ConfigMap's parity.toml has no [api] table")
	}
	api := ec.API
	listen("api.addr", api.Addr, apiPort)

	// secretFile checks p is a file of a mounted Secret volume and returns that volume.
	secretFile := func(key, p string) *corev1.SecretVolumeSource {
		vm, ok := mountOf(p)
		if !ok || !vm.ReadOnly || vols[vm.Name].Secret == nil {
			t.Errorf("%s %q is not in a read-only Secret volume", key, p)
			return nil
		}
		sv := vols[vm.Name].Secret
		rel := strings.TrimPrefix(p, vm.MountPath+"/")
		if !slices.ContainsFunc(sv.Items, func(it corev1.KeyToPath) bool { return it.Path == rel }) &&
			!(len(sv.Items) == 0 && sv.SecretName == m.secret.Name && secretKeys(m.secret)[rel]) {
			t.Errorf("%s %q: the Secret volume %s has no item at %q", key, p, vm.Name, rel)
		}
		return sv
	}

	// The token file: from the Secret in these manifests, and a token file parity reads.
	if api.TokenFile == "" {
		t.Fatal("api.token-file is empty: the API on every interface needs authentication")
	}
	if sv := secretFile("api.token-file", api.TokenFile); sv != nil {
		if sv.SecretName != m.secret.Name {
			t.Errorf("api.token-file is in Secret %s, want %s", sv.SecretName, m.secret.Name)
		}
		for _, it := range sv.Items {
			if strings.HasSuffix(api.TokenFile, "/"+it.Path) {
				checkTokenFile(t, m.secret.StringData[it.Key]+string(m.secret.Data[it.Key]))
			}
		}
	}

	// Tokens off loopback need TLS (or api.insecure). The kubelet's gRPC probe speaks
	// plaintext (TLS only behind the alpha gate GRPCContainerProbeTLS), so it is the
	// readiness probe only of a plaintext API; a TLS API is probed through /healthz.
	rp := c.ReadinessProbe
	switch {
	case api.Insecure:
		if rp == nil || rp.GRPC == nil || rp.GRPC.Port != apiPort || (rp.GRPC.Mode != nil && *rp.GRPC.Mode != corev1.GRPCProbeModePlaintext) {
			t.Errorf("readinessProbe %+v: want the gRPC health check on %d (the API is plaintext)", rp, apiPort)
		}
	case api.TLS.CertFile == "" || api.TLS.KeyFile == "":
		t.Error("[api.tls] cert-file and key-file are required: tokens on a non-loopback api.addr need TLS (or api.insecure)")
	default:
		secretFile("api.tls.cert-file", api.TLS.CertFile)
		secretFile("api.tls.key-file", api.TLS.KeyFile)
		if rp == nil || rp.HTTPGet == nil || rp.HTTPGet.Path != "/healthz" || containerPort(t, c, rp.HTTPGet.Port) != statusPort {
			t.Errorf("readinessProbe %+v: want httpGet /healthz on %d (the kubelet's gRPC probe cannot reach a TLS API)", rp, statusPort)
		}
	}
}

// checkTokenFile decodes the Secret's API token file strictly and checks each entry as
// api/README.md describes it.
func checkTokenFile(t *testing.T, doc string) {
	t.Helper()
	var tf tokenFile
	md, err := toml.Decode(doc, &tf)
	if err != nil {
		t.Fatalf("the Secret's api-tokens: %v", err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		t.Errorf("the Secret's api-tokens: unknown keys %v", und)
	}
	if len(tf.Token) == 0 {
		t.Error("the Secret's api-tokens has no [[token]] entry")
	}
	for i, e := range tf.Token {
		if !regexp.MustCompile(`^[A-Za-z0-9._-]+$`).MatchString(e.Name) {
			t.Errorf("api-tokens entry %d: name %q", i+1, e.Name)
		}
		if !slices.Contains([]string{"read", "operate", "repair"}, e.Role) {
			t.Errorf("api-tokens entry %d: role %q is not read, operate or repair", i+1, e.Role)
		}
		if (e.Token == "") == (e.SHA256 == "") || (e.SHA256 != "" && !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(e.SHA256)) ||
			(e.Token != "" && (len(e.Token) < 16 || strings.ContainsAny(e.Token, " \t"))) {
			t.Errorf("api-tokens entry %d: want a token of 16+ bytes without spaces or a hex sha256, one of them", i+1)
		}
	}
}
