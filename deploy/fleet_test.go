package deploy

// The fleet of fallbacks: one parity serve per fallback server. The systemd template
// unit, the Kubernetes example with one Deployment per member and the Prometheus scrape
// configuration that labels every member's daemons.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

const (
	templateUnitPath = "systemd/parity@.service"
	fleetK8sDir      = "k8s-fleet"
	fleetPromConfig  = "prometheus/prometheus-fleet.yml"
	memberLabel      = "app.kubernetes.io/instance"
)

// templateKeys are the [Service] keys the template sets per instance; every other key
// of parity.service (its hardening above all) must be the same in the template.
var templateKeys = []string{"ExecStart", "EnvironmentFile", "StateDirectory", "CacheDirectory", "Environment", "WorkingDirectory"}

// TestSystemdTemplateUnit: parity@.service runs `parity serve --config
// /etc/parity/%i.toml` with the member's own secrets, state and cache, and is otherwise
// parity.service key for key (so weakening one hardening key fails here as it does
// for parity.service in TestSystemdUnitHardening).
func TestSystemdTemplateUnit(t *testing.T) {
	read := func(p string) unitFile {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return parseUnit(t, data)
	}
	single, tmpl := read(unitPath), read(templateUnitPath)
	for _, section := range []string{"Unit", "Service", "Install"} {
		keys := map[string]bool{}
		for k := range single[section] {
			keys[k] = true
		}
		for k := range tmpl[section] {
			keys[k] = true
		}
		for k := range keys {
			if section == "Service" && slices.Contains(templateKeys, k) || section == "Unit" && k == "Description" {
				continue
			}
			if a, b := single[section][k], tmpl[section][k]; !slices.Equal(a, b) {
				t.Errorf("[%s] %s: parity.service has %q, parity@.service %q", section, k, a, b)
			}
		}
	}
	want := map[string]string{
		"ExecStart":        "/usr/local/bin/parity serve --config /etc/parity/%i.toml",
		"EnvironmentFile":  "-/etc/parity/%i.env",
		"StateDirectory":   "parity/%i",
		"CacheDirectory":   "parity/%i",
		"Environment":      "TMPDIR=/var/cache/parity/%i",
		"WorkingDirectory": "/var/lib/parity/%i",
	}
	for k, v := range want {
		if got, _ := tmpl.last("Service", k); got != v {
			t.Errorf("[Service] %s = %q, want %q", k, got, v)
		}
	}
	if d, _ := tmpl.last("Unit", "Description"); !strings.Contains(d, "%i") {
		t.Errorf("[Unit] Description = %q does not name the member (%%i)", d)
	}
}

// templateInstance writes the template (ExecStart pointing at the built binary) into a
// temp dir and returns the path of its instance parity@shard1.service.
func templateInstance(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(templateUnitPath)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^ExecStart=\S+`)
	if len(re.FindAll(data, -1)) != 1 {
		t.Fatalf("%s: want exactly one ExecStart= line", templateUnitPath)
	}
	data = re.ReplaceAll(data, []byte("ExecStart="+parityBin))
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "parity@.service"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "parity@shard1.service")
}

// TestSystemdTemplateUnitVerify: `systemd-analyze verify` loads an instance of the
// template without a warning, and `systemd-analyze security` scores it as confined as
// parity.service (exposure at most 2.0).
func TestSystemdTemplateUnitVerify(t *testing.T) {
	sa := systemdAnalyze(t)
	unit := templateInstance(t)
	out, err := exec.Command(sa, "verify", "--man=no", unit).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if strings.Contains(line, "parity@") {
			t.Errorf("systemd-analyze verify: %s", line)
		}
	}
	out, err = exec.Command(sa, "security", "--offline=true", "--no-pager", "--threshold=20", unit).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security: %v (exposure above 2.0)\n%s", err, out)
	}
	t.Logf("%s", lastLine(out))
}

// fleetManifests is every object of deploy/k8s-fleet, decoded strictly.
type fleetManifests struct {
	files          []string
	kustomization  *kustomization
	deployments    []*appsv1.Deployment
	services       []*corev1.Service
	configMap      *corev1.ConfigMap
	secret         *corev1.Secret
	serviceMonitor *serviceMonitor
}

func loadFleetManifests(t *testing.T) *fleetManifests {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(fleetK8sDir, "*.y*ml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no manifests under %s (%v)", fleetK8sDir, err)
	}
	m := &fleetManifests{}
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

func (m *fleetManifests) add(doc []byte) error {
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
		var d appsv1.Deployment
		m.deployments = append(m.deployments, &d)
		return decodeStrict(doc, &d)
	case "/v1, Kind=Service":
		var s corev1.Service
		m.services = append(m.services, &s)
		return decodeStrict(doc, &s)
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

// memberConfig is the part of a member's parity.toml the fleet needs distinct or set.
type memberConfig struct {
	Changefeed struct {
		ID     string   `toml:"id"`
		Topics []string `toml:"topics"`
	} `toml:"changefeed"`
	Verify struct {
		Tables []string `toml:"tables"`
	} `toml:"verify"`
	HA struct {
		Enabled bool `toml:"enabled"`
	} `toml:"ha"`
}

// TestK8sFleet: one Deployment per member, each reading its own <member>.toml from the
// ConfigMap and its own fallback DSN from the Secret, selecting only its own pods; one
// member with a standby replica (replicas 2, [ha] on, a rolling update that keeps a
// daemon), the others one replica, Recreate, [ha] off; the members' changefeed ids,
// topics and tables distinct; a Service per member selecting exactly its pods; a
// ServiceMonitor that scrapes every member and sets the label member from the pods'
// app.kubernetes.io/instance; the kustomization listing every manifest.
func TestK8sFleet(t *testing.T) {
	m := loadFleetManifests(t)
	if m.kustomization == nil || m.configMap == nil || m.secret == nil || m.serviceMonitor == nil {
		t.Fatal("deploy/k8s-fleet needs a kustomization, a ConfigMap, a Secret and a ServiceMonitor")
	}
	res := slices.Clone(m.kustomization.Resources)
	slices.Sort(res)
	files := slices.Clone(m.files)
	slices.Sort(files)
	if !slices.Equal(res, files) {
		t.Errorf("kustomization resources %v, manifests %v", res, files)
	}
	if len(m.deployments) < 2 {
		t.Fatalf("%d Deployments: want one per member", len(m.deployments))
	}
	members := map[string]*appsv1.Deployment{}
	ids, topics, tables := map[string]string{}, map[string]string{}, map[string]string{}
	standbys := 0
	for _, d := range m.deployments {
		member := d.Spec.Template.Labels[memberLabel]
		where := "Deployment " + d.Name
		if member == "" || d.Spec.Selector.MatchLabels[memberLabel] != member || d.Labels[memberLabel] != member {
			t.Errorf("%s: label %s %q on the pod template, %q in the selector, %q on the Deployment",
				where, memberLabel, member, d.Spec.Selector.MatchLabels[memberLabel], d.Labels[memberLabel])
			continue
		}
		if members[member] != nil {
			t.Errorf("%s: member %s has a second Deployment", where, member)
		}
		members[member] = d
		if len(d.Spec.Template.Spec.Containers) != 1 {
			t.Fatalf("%s: %d containers", where, len(d.Spec.Template.Spec.Containers))
		}
		c := d.Spec.Template.Spec.Containers[0]
		file := member + ".toml"
		if !slices.Equal(c.Args, []string{"--config", "/etc/parity/" + file}) {
			t.Errorf("%s: args %v, want --config /etc/parity/%s", where, c.Args, file)
		}
		if !slices.ContainsFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool {
			return vm.MountPath == "/etc/parity/"+file && vm.SubPath == file
		}) {
			t.Errorf("%s: %s is not mounted at /etc/parity/%s", where, file, file)
		}
		for _, e := range c.Env {
			if e.Name != "PARITY_DOWNSTREAM_DSN" {
				continue
			}
			key := e.ValueFrom.SecretKeyRef.Key
			if key != "downstream-dsn-"+member || m.secret.StringData[key] == "" {
				t.Errorf("%s: PARITY_DOWNSTREAM_DSN from Secret key %q, want downstream-dsn-%s (present)", where, key, member)
			}
		}
		doc, ok := m.configMap.Data[file]
		if !ok {
			t.Errorf("%s: the ConfigMap has no %s", where, file)
			continue
		}
		var mc memberConfig
		if _, err := toml.Decode(doc, &mc); err != nil {
			t.Errorf("%s: %s: %v", where, file, err)
			continue
		}
		if other, dup := ids[mc.Changefeed.ID]; dup {
			t.Errorf("%s: changefeed id %q is also %s's", file, mc.Changefeed.ID, other)
		}
		ids[mc.Changefeed.ID] = member
		for _, tp := range mc.Changefeed.Topics {
			if other, dup := topics[tp]; dup {
				t.Errorf("%s: topic %s is also %s's: each fallback consumes its own schemas' topics", file, tp, other)
			}
			topics[tp] = member
		}
		for _, tb := range mc.Verify.Tables {
			if other, dup := tables[tb]; dup {
				t.Errorf("%s: verify.tables %s is also %s's", file, tb, other)
			}
			tables[tb] = member
		}
		if len(mc.Changefeed.Topics) == 0 || len(mc.Verify.Tables) == 0 {
			t.Errorf("%s: no topics or no verify.tables", file)
		}
		replicas := int32(1)
		if d.Spec.Replicas != nil {
			replicas = *d.Spec.Replicas
		}
		switch {
		case replicas == 2 && mc.HA.Enabled:
			standbys++
			ru := d.Spec.Strategy.RollingUpdate
			if d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || ru == nil || ru.MaxSurge == nil || ru.MaxSurge.IntValue() != 0 ||
				ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 1 {
				t.Errorf("%s: strategy %+v: with a standby, a rolling update of one pod at a time (maxSurge 0, maxUnavailable 1)", where, d.Spec.Strategy)
			}
		case replicas == 1 && !mc.HA.Enabled:
			if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
				t.Errorf("%s: strategy %s: one daemon must stop before the next starts (Recreate)", where, d.Spec.Strategy.Type)
			}
		default:
			t.Errorf("%s: %d replicas with ha.enabled %v: a second replica needs [ha], [ha] a second replica", where, replicas, mc.HA.Enabled)
		}
	}
	if standbys != 1 {
		t.Errorf("%d members with a standby, want 1", standbys)
	}
	for name := range m.configMap.Data {
		if members[strings.TrimSuffix(name, ".toml")] == nil {
			t.Errorf("ConfigMap key %s: no Deployment reads it", name)
		}
	}
	// No Deployment's selector takes another member's pods.
	for _, d := range m.deployments {
		sel := labels.SelectorFromSet(d.Spec.Selector.MatchLabels)
		for _, o := range m.deployments {
			if o != d && sel.Matches(labels.Set(o.Spec.Template.Labels)) {
				t.Errorf("Deployment %s selects the pods of %s", d.Name, o.Name)
			}
		}
	}
	// One Service per member, selecting exactly its pods, with the status and API ports.
	served := map[string]bool{}
	for _, s := range m.services {
		sel := labels.SelectorFromSet(s.Spec.Selector)
		var hits []string
		for member, d := range members {
			if sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				hits = append(hits, member)
			}
		}
		if len(hits) != 1 {
			t.Errorf("Service %s selects the pods of %v, want one member's", s.Name, hits)
			continue
		}
		served[hits[0]] = true
		var ports []string
		for _, p := range s.Spec.Ports {
			ports = append(ports, fmt.Sprintf("%s:%d", p.Name, p.Port))
		}
		if !slices.Equal(ports, []string{fmt.Sprintf("status:%d", statusPort), fmt.Sprintf("api:%d", apiPort)}) {
			t.Errorf("Service %s ports %v", s.Name, ports)
		}
		if !sel.Matches(labels.Set(s.Labels)) {
			t.Errorf("Service %s: its labels %v are not its pods' (the ServiceMonitor selects Services by them)", s.Name, s.Labels)
		}
	}
	for member := range members {
		if !served[member] {
			t.Errorf("member %s has no Service", member)
		}
	}
	// The ServiceMonitor scrapes every member's Service and labels targets by member.
	sm := m.serviceMonitor
	smSel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range m.services {
		if !smSel.Matches(labels.Set(s.Labels)) {
			t.Errorf("ServiceMonitor %s does not select Service %s", sm.Name, s.Name)
		}
	}
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "status" || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Fatalf("ServiceMonitor endpoints %+v: want the status port's /metrics", sm.Spec.Endpoints)
	}
	relabel := false
	for _, r := range sm.Spec.Endpoints[0].Relabelings {
		if slices.Equal(r.SourceLabels, []string{"__meta_kubernetes_pod_label_app_kubernetes_io_instance"}) && r.TargetLabel == "member" &&
			(r.Action == "" || r.Action == "replace") {
			relabel = true
		}
	}
	if !relabel {
		t.Errorf("ServiceMonitor %s: no relabeling sets member from the pods' %s", sm.Name, memberLabel)
	}
}

// TestPrometheusFleetConfig: promtool accepts the fleet's scrape configuration (with
// the alert rules it loads), and every target is scraped as job parity with a member
// label (the Fleet dashboard's and ParityFleetMemberBehind's), one member with two
// targets (its standby).
func TestPrometheusFleetConfig(t *testing.T) {
	raw, err := os.ReadFile(fleetPromConfig)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		RuleFiles     []string `json:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `json:"job_name"`
			StaticConfigs []struct {
				Targets []string          `json:"targets"`
				Labels  map[string]string `json:"labels"`
			} `json:"static_configs"`
		} `json:"scrape_configs"`
	}
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(cfg.RuleFiles, "parity-alerts.yml") {
		t.Errorf("rule_files %v: want parity-alerts.yml", cfg.RuleFiles)
	}
	targets := map[string][]string{} // member -> targets
	for _, sc := range cfg.ScrapeConfigs {
		if sc.JobName != "parity" {
			t.Errorf("scrape job %q: the alert rules select job parity", sc.JobName)
		}
		for _, st := range sc.StaticConfigs {
			member := st.Labels["member"]
			if member == "" {
				t.Errorf("targets %v have no member label", st.Targets)
			}
			targets[member] = append(targets[member], st.Targets...)
		}
	}
	two := 0
	for member, ts := range targets {
		if len(ts) == 2 {
			two++
		}
		if len(ts) == 0 || len(ts) > 2 {
			t.Errorf("member %s: targets %v", member, ts)
		}
	}
	if len(targets) < 2 || two != 1 {
		t.Errorf("members %v: want several, one with a standby (two targets)", targets)
	}

	dir := os.Getenv("PARITY_PROMETHEUS_DIR")
	if dir == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("PARITY_PROMETHEUS_DIR is not set (scripts/env up sets it in var/env.sh)")
		}
		t.Skip("PARITY_PROMETHEUS_DIR is not set: promtool check config not run (source var/env.sh)")
	}
	out, err := exec.Command(filepath.Join(dir, "promtool"), "check", "config", fleetPromConfig).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check config %s: %v\n%s", fleetPromConfig, err, out)
	}
}
