package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

const k8sDir = "k8s"

// Ports of parity serve: status.addr (metrics, /healthz) and api.addr (gRPC).
const (
	statusPort = 8390
	apiPort    = 8391
)

// serviceMonitor mirrors the part of the Prometheus Operator's monitoring.coreos.com/v1
// ServiceMonitor these manifests may use, with the operator's JSON names: decoding
// strictly into it rejects a misspelt or misplaced field. (The operator's own Go types
// would pull a large dependency tree into this module for one object.)
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		JobLabel          string               `json:"jobLabel,omitempty"`
		TargetLabels      []string             `json:"targetLabels,omitempty"`
		PodTargetLabels   []string             `json:"podTargetLabels,omitempty"`
		Endpoints         []smEndpoint         `json:"endpoints"`
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector *struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector,omitempty"`
		SampleLimit *uint64 `json:"sampleLimit,omitempty"`
	} `json:"spec"`
}

type smEndpoint struct {
	Port              string              `json:"port,omitempty"`
	TargetPort        *intstr.IntOrString `json:"targetPort,omitempty"`
	Path              string              `json:"path,omitempty"`
	Scheme            string              `json:"scheme,omitempty"`
	Interval          string              `json:"interval,omitempty"`
	ScrapeTimeout     string              `json:"scrapeTimeout,omitempty"`
	HonorLabels       bool                `json:"honorLabels,omitempty"`
	Relabelings       []smRelabel         `json:"relabelings,omitempty"`
	MetricRelabelings []smRelabel         `json:"metricRelabelings,omitempty"`
}

type smRelabel struct {
	SourceLabels []string `json:"sourceLabels,omitempty"`
	Separator    *string  `json:"separator,omitempty"`
	TargetLabel  string   `json:"targetLabel,omitempty"`
	Regex        string   `json:"regex,omitempty"`
	Modulus      uint64   `json:"modulus,omitempty"`
	Replacement  *string  `json:"replacement,omitempty"`
	Action       string   `json:"action,omitempty"`
}

// kustomization mirrors the kustomize.config.k8s.io/v1beta1 fields used here.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace,omitempty"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
		Digest  string `json:"digest,omitempty"`
	} `json:"images,omitempty"`
}

// manifests is every object of deploy/k8s, decoded strictly into its type.
type manifests struct {
	files          []string // the manifest files (kustomization.yaml excluded)
	kustomization  *kustomization
	deployment     *appsv1.Deployment
	service        *corev1.Service
	configMap      *corev1.ConfigMap
	secret         *corev1.Secret
	serviceMonitor *serviceMonitor
}

// loadManifests decodes every YAML document under deploy/k8s strictly: unknown or
// duplicate fields, a kind this test does not know and a second object of a kind are
// all errors.
func loadManifests(t *testing.T) *manifests {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(k8sDir, "*.y*ml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no manifests under %s (%v)", k8sDir, err)
	}
	m := &manifests{}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(p) != "kustomization.yaml" {
			m.files = append(m.files, filepath.Base(p))
		}
		for i, doc := range splitYAML(data) {
			if err := m.add(doc); err != nil {
				t.Errorf("%s (document %d): %v", p, i+1, err)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	return m
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

func splitYAML(data []byte) [][]byte {
	var docs [][]byte
	for _, d := range docSep.Split(string(data), -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(d, "")) != "" {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}

// decodeStrict decodes one YAML document into dst the way the API server's strict field
// validation does: duplicate keys, unknown fields and fields differing only in case
// (encoding/json, and so sigs.k8s.io/yaml's UnmarshalStrict, would take
// readOnlyRootFileSystem for readOnlyRootFilesystem) are errors.
func decodeStrict(doc []byte, dst any) error {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(js, dst)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

func (m *manifests) add(doc []byte) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	once := func(dst any, isSet bool) error {
		if isSet {
			return fmt.Errorf("a second %s", tm.Kind)
		}
		return decodeStrict(doc, dst)
	}
	switch tm.GroupVersionKind().String() {
	case "apps/v1, Kind=Deployment":
		return once(&m.deployment, m.deployment != nil)
	case "/v1, Kind=Service":
		return once(&m.service, m.service != nil)
	case "/v1, Kind=ConfigMap":
		return once(&m.configMap, m.configMap != nil)
	case "/v1, Kind=Secret":
		return once(&m.secret, m.secret != nil)
	case "monitoring.coreos.com/v1, Kind=ServiceMonitor":
		return once(&m.serviceMonitor, m.serviceMonitor != nil)
	case "kustomize.config.k8s.io/v1beta1, Kind=Kustomization":
		return once(&m.kustomization, m.kustomization != nil)
	}
	return fmt.Errorf("unexpected object %s %s", tm.APIVersion, tm.Kind)
}

// TestK8sManifestsStrict decodes every manifest strictly into the Kubernetes API types
// (and the ServiceMonitor and Kustomization into mirrors of theirs), checks each kind
// is there once and that the kustomization lists every manifest.
func TestK8sManifestsStrict(t *testing.T) {
	m := loadManifests(t)
	for kind, missing := range map[string]bool{
		"Deployment": m.deployment == nil, "Service": m.service == nil, "ConfigMap": m.configMap == nil,
		"Secret": m.secret == nil, "ServiceMonitor": m.serviceMonitor == nil, "Kustomization": m.kustomization == nil,
	} {
		if missing {
			t.Errorf("no %s under %s", kind, k8sDir)
		}
	}
	if t.Failed() {
		return
	}
	res := slices.Clone(m.kustomization.Resources)
	sort.Strings(res)
	if !slices.Equal(res, m.files) {
		t.Errorf("kustomization.yaml resources %v, want every manifest %v", res, m.files)
	}
	img := m.deployment.Spec.Template.Spec.Containers[0].Image
	for _, i := range m.kustomization.Images {
		if name, _, _ := strings.Cut(img, ":"); i.Name != name {
			t.Errorf("kustomization.yaml images: %q is not the Deployment's image %q", i.Name, img)
		}
	}
}

// TestK8sStrictDecodeRejects shows the decoding above can fail: a misspelt field in a
// copy of the Deployment and a misplaced one in the ServiceMonitor are rejected.
func TestK8sStrictDecodeRejects(t *testing.T) {
	for file, edit := range map[string][2]string{
		"deployment.yaml":     {"readOnlyRootFilesystem:", "readOnlyRootFileSystem:"},
		"servicemonitor.yaml": {"scrapeTimeout:", "scrape_timeout:"},
	} {
		data, err := os.ReadFile(filepath.Join(k8sDir, file))
		if err != nil {
			t.Fatal(err)
		}
		bad := bytes.Replace(data, []byte(edit[0]), []byte(edit[1]), 1)
		if bytes.Equal(bad, data) {
			t.Fatalf("%s: %q not found", file, edit[0])
		}
		if err := (&manifests{}).add(bad); err == nil {
			t.Errorf("%s with %q decoded without error", file, edit[1])
		} else {
			t.Logf("%s with %q: %v", file, edit[1], err)
		}
	}
}

// parityContainer returns the Deployment's parity container.
func parityContainer(t *testing.T, d *appsv1.Deployment) *corev1.Container {
	t.Helper()
	cs := d.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		t.Fatalf("Deployment has %d containers, want 1", len(cs))
	}
	return &cs[0]
}

// containerPort resolves a probe's or Service's port (number or name) to a number.
func containerPort(t *testing.T, c *corev1.Container, p intstr.IntOrString) int32 {
	t.Helper()
	if p.Type == intstr.Int {
		return p.IntVal
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort
		}
	}
	t.Errorf("container has no port named %q", p.StrVal)
	return 0
}

// TestK8sDeployment checks the Deployment's invariants: one replica replaced by
// Recreate, probes on the right ports, a locked-down pod, resources, secrets from the
// Secret, and a writable, size-bounded spill volume.
func TestK8sDeployment(t *testing.T) {
	m := loadManifests(t)
	d := m.deployment
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
		t.Errorf("replicas = %v, want 1 (one applier per changefeed)", d.Spec.Replicas)
	}
	if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("strategy = %q, want Recreate (never two appliers at once)", d.Spec.Strategy.Type)
	}
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("selector %v does not match the pod labels %v (%v)", d.Spec.Selector, d.Spec.Template.Labels, err)
	}
	pod := d.Spec.Template.Spec
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("automountServiceAccountToken is not false: parity does not talk to the API server")
	}
	if g := pod.TerminationGracePeriodSeconds; g == nil || *g < 60 {
		t.Errorf("terminationGracePeriodSeconds = %v, want >= 60 (the round in flight finishes on SIGTERM)", g)
	}
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("pod securityContext %+v: want runAsNonRoot and a non-zero runAsUser", psc)
	}
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("pod seccompProfile is not RuntimeDefault")
	}

	c := parityContainer(t, d)
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Fatal("container has no securityContext")
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Error("container readOnlyRootFilesystem is not true")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("container allowPrivilegeEscalation is not false")
	case sc.Privileged != nil && *sc.Privileged:
		t.Error("container is privileged")
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
		t.Errorf("container capabilities %+v, want drop [ALL] and nothing added", sc.Capabilities)
	case sc.RunAsUser != nil && *sc.RunAsUser == 0:
		t.Error("container runs as root")
	}

	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["status"] != statusPort || ports["api"] != apiPort {
		t.Errorf("container ports %v, want status=%d api=%d", ports, statusPort, apiPort)
	}
	if c.ReadinessProbe == nil {
		t.Error("no readinessProbe (TestK8sConfigMapConfig checks which one fits the API's transport)")
	}
	for name, p := range map[string]*corev1.Probe{"livenessProbe": c.LivenessProbe, "startupProbe": c.StartupProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || containerPort(t, c, p.HTTPGet.Port) != statusPort {
			t.Errorf("%s %+v: want httpGet /healthz on %d", name, p, statusPort)
		}
	}

	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, okReq := c.Resources.Requests[r]
		lim, okLim := c.Resources.Limits[r]
		if !okReq || !okLim {
			t.Errorf("resources: %s request (%v) and limit (%v) must both be set", r, okReq, okLim)
		} else if req.Cmp(lim) > 0 {
			t.Errorf("resources: %s request %s above its limit %s", r, req.String(), lim.String())
		}
	}

	// The DSNs come from the Secret, by keys it has; none is written in the manifest.
	keys := secretKeys(m.secret)
	for _, want := range []string{"PARITY_UPSTREAM_DSN", "PARITY_DOWNSTREAM_DSN"} {
		i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == want })
		switch {
		case i < 0:
			t.Errorf("env %s is not set", want)
		case c.Env[i].Value != "" || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.SecretKeyRef == nil:
			t.Errorf("env %s does not come from a Secret", want)
		case c.Env[i].ValueFrom.SecretKeyRef.Name != m.secret.Name || !keys[c.Env[i].ValueFrom.SecretKeyRef.Key]:
			t.Errorf("env %s refers to %s/%s, not a key of Secret %s %v", want,
				c.Env[i].ValueFrom.SecretKeyRef.Name, c.Env[i].ValueFrom.SecretKeyRef.Key, m.secret.Name, keys)
		}
	}

	// Every mount names a volume; the writable ones are emptyDirs with a size limit or PVCs.
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		vols[v.Name] = v
	}
	for _, vm := range c.VolumeMounts {
		v, ok := vols[vm.Name]
		switch {
		case !ok:
			t.Errorf("volumeMount %s: no such volume", vm.Name)
		case v.EmptyDir != nil:
			if v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.IsZero() {
				t.Errorf("emptyDir %s has no sizeLimit", v.Name)
			}
		case v.PersistentVolumeClaim != nil:
		case !vm.ReadOnly:
			t.Errorf("volumeMount %s (%s) is writable but not scratch space", vm.Name, vm.MountPath)
		}
	}
}

func secretKeys(s *corev1.Secret) map[string]bool {
	keys := map[string]bool{}
	for k := range s.Data {
		keys[k] = true
	}
	for k := range s.StringData {
		keys[k] = true
	}
	return keys
}

// TestK8sServiceAndMonitor checks the Service selects the pod and exposes both ports,
// and the ServiceMonitor scrapes /metrics on the status port through it.
func TestK8sServiceAndMonitor(t *testing.T) {
	m := loadManifests(t)
	c := parityContainer(t, m.deployment)
	if !labels.SelectorFromSet(m.service.Spec.Selector).Matches(labels.Set(m.deployment.Spec.Template.Labels)) ||
		len(m.service.Spec.Selector) == 0 {
		t.Errorf("Service selector %v does not select the pod labels %v", m.service.Spec.Selector, m.deployment.Spec.Template.Labels)
	}
	byName := map[string]int32{}
	for _, p := range m.service.Spec.Ports {
		byName[p.Name] = containerPort(t, c, p.TargetPort)
	}
	if byName["status"] != statusPort || byName["api"] != apiPort {
		t.Errorf("Service ports reach %v, want status->%d api->%d", byName, statusPort, apiPort)
	}

	sm := m.serviceMonitor
	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(m.service.Labels)) {
		t.Errorf("ServiceMonitor selector %v does not select the Service's labels %v (%v)", sm.Spec.Selector, m.service.Labels, err)
	}
	if len(sm.Spec.Endpoints) != 1 {
		t.Fatalf("ServiceMonitor has %d endpoints, want 1", len(sm.Spec.Endpoints))
	}
	ep := sm.Spec.Endpoints[0]
	if byName[ep.Port] != statusPort {
		t.Errorf("ServiceMonitor scrapes Service port %q, want the one reaching %d", ep.Port, statusPort)
	}
	if ep.Path != "" && ep.Path != "/metrics" {
		t.Errorf("ServiceMonitor path %q, want /metrics", ep.Path)
	}
}

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
