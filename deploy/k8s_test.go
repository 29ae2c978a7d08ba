package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
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
