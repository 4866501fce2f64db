// Package kubernetes holds the deployment manifests; its tests keep them
// honest without a cluster: every document decodes strictly into the
// Kubernetes API types, the kustomize component builds against a plain
// vLLM Deployment, and everything the manifests ask of the sidecar (env
// names, ports, probe paths, shutdown timing) is what the binary accepts
// and serves.
package kubernetes

import (
	"bytes"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/timing-sidecar/timing-sidecar/deploy/inject"
	"github.com/timing-sidecar/timing-sidecar/proxy"
	"github.com/timing-sidecar/timing-sidecar/telemetry/spool"
)

// serviceMonitor is the part of the Prometheus Operator's CRD the example
// uses; strict decoding catches a misspelt field.
type serviceMonitor struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// objects is a decoded set of manifests.
type objects struct {
	deployments []appsv1.Deployment
	services    []corev1.Service
	monitors    []serviceMonitor
	rules       []prometheusRule
}

// ruleGroups is a Prometheus rules file's content, and a PrometheusRule's
// spec.
type ruleGroups struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Record      string            `json:"record,omitempty"`
			Alert       string            `json:"alert,omitempty"`
			Expr        string            `json:"expr"`
			For         string            `json:"for,omitempty"`
			Labels      map[string]string `json:"labels,omitempty"`
			Annotations map[string]string `json:"annotations,omitempty"`
		} `json:"rules"`
	} `json:"groups"`
}

// prometheusRule is the Prometheus Operator's PrometheusRule.
type prometheusRule struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels,omitempty"`
	} `json:"metadata"`
	Spec ruleGroups `json:"spec"`
}

// decode splits YAML documents and decodes each strictly by kind.
func decode(t *testing.T, name string, data []byte) objects {
	t.Helper()
	var o objects
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var head struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var err error
		switch head.Kind {
		case "Deployment":
			var d appsv1.Deployment
			err = yaml.UnmarshalStrict([]byte(doc), &d)
			o.deployments = append(o.deployments, d)
		case "Service":
			var s corev1.Service
			err = yaml.UnmarshalStrict([]byte(doc), &s)
			o.services = append(o.services, s)
		case "PrometheusRule":
			var r prometheusRule
			err = yaml.UnmarshalStrict([]byte(doc), &r)
			o.rules = append(o.rules, r)
		case "ServiceMonitor":
			var m serviceMonitor
			err = yaml.UnmarshalStrict([]byte(doc), &m)
			o.monitors = append(o.monitors, m)
		default:
			t.Fatalf("%s: unexpected kind %q", name, head.Kind)
		}
		if err != nil {
			t.Fatalf("%s: %s does not decode strictly: %v", name, head.Kind, err)
		}
	}
	return o
}

// build runs kustomize on dir and decodes the result.
func build(t *testing.T, dir string) objects {
	t.Helper()
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := res.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, dir, out)
}

// knownEnv reads the environment variables the binary accepts from its
// flags table (cmd/timing-sidecar/README.md), which a test there keeps
// equal to the flag definitions.
func knownEnv(t *testing.T) map[string]bool {
	t.Helper()
	readme, err := os.ReadFile("../../cmd/timing-sidecar/README.md")
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]bool{}
	for _, m := range regexp.MustCompile("`(TIMING_SIDECAR_[A-Z0-9_]+)`").FindAllSubmatch(readme, -1) {
		env[string(m[1])] = true
	}
	if len(env) < 20 {
		t.Fatalf("found only %d environment variables in the flags table", len(env))
	}
	return env
}

// checkSidecar checks the sidecar container of a pod spec against the
// binary, and returns it.
func checkSidecar(t *testing.T, spec *corev1.PodSpec) *corev1.Container {
	t.Helper()
	sc := findSidecar(t, spec)
	checkSidecarIsolation(t, sc)
	env := checkSidecarEnvNames(t, sc)
	checkSidecarEnvSettings(t, sc, env)
	checkSidecarPorts(t, sc, env)
	checkSidecarProbes(t, sc)
	checkShutdownGrace(t, spec, env)
	checkSpool(t, spec, sc, env)
	return sc
}

// checkSpool checks that the usage records' spool is on the sidecar's
// mount of an emptyDir (its root filesystem is read-only; an emptyDir
// outlives a restart of the container) whose sizeLimit is above the
// spool's bound: the kubelet evicts a pod whose emptyDir holds more
// (deploy/inject's spoolProblems has the rule and the margin).
func checkSpool(t *testing.T, spec *corev1.PodSpec, sc *corev1.Container, env map[string]string) {
	t.Helper()
	bound := int64(spool.DefaultMaxSize)
	if v, ok := env["TIMING_SIDECAR_USAGE_SPOOL_MAX_SIZE"]; ok {
		bound, _ = strconv.ParseInt(v, 0, 64)
	}
	for _, m := range sc.VolumeMounts {
		if m.MountPath != env["TIMING_SIDECAR_USAGE_SPOOL_DIR"] || m.ReadOnly {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.EmptyDir != nil && v.EmptyDir.SizeLimit != nil && v.EmptyDir.SizeLimit.Value() > bound {
				return
			}
		}
	}
	t.Errorf("the usage spool %q is not on a mount of an emptyDir sized above its bound %d: mounts %+v",
		env["TIMING_SIDECAR_USAGE_SPOOL_DIR"], bound, sc.VolumeMounts)
}

// findSidecar returns the timing-sidecar init container, or stops the test.
func findSidecar(t *testing.T, spec *corev1.PodSpec) *corev1.Container {
	t.Helper()
	var sc *corev1.Container
	for i := range spec.InitContainers {
		if spec.InitContainers[i].Name == "timing-sidecar" {
			sc = &spec.InitContainers[i]
		}
	}
	if sc == nil {
		t.Fatal("no timing-sidecar init container")
	}
	return sc
}

// checkSidecarIsolation checks that the sidecar is a native sidecar and
// runs with the least privilege.
func checkSidecarIsolation(t *testing.T, sc *corev1.Container) {
	t.Helper()
	if sc.RestartPolicy == nil || *sc.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Error("timing-sidecar is not a native sidecar (restartPolicy: Always)")
	}
	if c := sc.SecurityContext; c == nil || c.RunAsNonRoot == nil || !*c.RunAsNonRoot ||
		c.ReadOnlyRootFilesystem == nil || !*c.ReadOnlyRootFilesystem ||
		c.AllowPrivilegeEscalation == nil || *c.AllowPrivilegeEscalation {
		t.Error("timing-sidecar must run as non-root, on a read-only root filesystem, without privilege escalation")
	}
}

// checkSidecarEnvNames checks that every env var the sidecar is given is
// one the binary, the OpenTelemetry SDK or the Go runtime reads, and
// returns the ones that are not the SDK's, by name.
func checkSidecarEnvNames(t *testing.T, sc *corev1.Container) map[string]string {
	t.Helper()
	known := knownEnv(t)
	env := map[string]string{}
	for _, e := range sc.Env {
		// The standard OpenTelemetry variables, and the pod's own names
		// that they may refer to, are read by the SDK.
		if strings.HasPrefix(e.Name, "OTEL_") || strings.HasPrefix(e.Name, "POD_") {
			continue
		}
		if e.Name == "GOMEMLIMIT" {
			checkGoMemLimit(t, sc, e.Value)
		} else if !known[e.Name] {
			t.Errorf("env %s is not a setting the binary accepts", e.Name)
		}
		env[e.Name] = e.Value
	}
	return env
}

// checkGoMemLimit checks the Go runtime's GOMEMLIMIT: below the
// container's limit, with room for what is not heap and for the heap's
// overshoot while large bodies arrive during a collection
// (deploy/README.md, "Memory").
func checkGoMemLimit(t *testing.T, sc *corev1.Container, value string) {
	t.Helper()
	limit := sc.Resources.Limits.Memory().Value()
	if v, err := resource.ParseQuantity(strings.TrimSuffix(value, "B")); err != nil || v.Value() > limit*5/8 {
		t.Errorf("GOMEMLIMIT %s is not well under the memory limit %d", value, limit)
	}
}

// checkSidecarEnvSettings checks the settings every deployment of the
// sidecar needs.
func checkSidecarEnvSettings(t *testing.T, sc *corev1.Container, env map[string]string) {
	t.Helper()
	if env["GOMEMLIMIT"] == "" {
		t.Error("no GOMEMLIMIT: the Go runtime would let the heap reach twice what is live")
	}
	if env["TIMING_SIDECAR_PER_REQUEST_METRICS"] == "" {
		t.Error("per-request metrics is not one env var away")
	}
	instanceFromPod := false
	for _, e := range sc.Env {
		instanceFromPod = instanceFromPod || e.Name == "TIMING_SIDECAR_SERVICE_INSTANCE_ID" &&
			e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name"
	}
	if !instanceFromPod {
		t.Error("service.instance.id is not the pod's name: sidecars reporting to one collector would not stay apart")
	}
	sized := false
	for _, e := range sc.Env {
		sized = sized || e.Name == "TIMING_SIDECAR_CPU_REQUEST" && e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil &&
			e.ValueFrom.ResourceFieldRef.Resource == "requests.cpu" && e.ValueFrom.ResourceFieldRef.ContainerName == sc.Name
	}
	if _, ok := sc.Resources.Limits[corev1.ResourceCPU]; !sized && !ok {
		t.Error("neither a CPU limit nor the CPU request reaches the sidecar: on a GPU node it would run on every core")
	}
}

// listenPort is the port of the listen address env sets under key, or of
// def when env does not set it.
func listenPort(env map[string]string, key, def string) int32 {
	addr := def
	if v, ok := env[key]; ok {
		addr = v
	}
	n, _ := strconv.Atoi(addr[strings.LastIndex(addr, ":")+1:])
	return int32(n)
}

// checkSidecarPorts checks that the container's ports are the ones the
// sidecar listens on.
func checkSidecarPorts(t *testing.T, sc *corev1.Container, env map[string]string) {
	t.Helper()
	ports := map[string]int32{}
	for _, p := range sc.Ports {
		ports[p.Name] = p.ContainerPort
	}
	// The first port is the one it serves on: the engine's old port.
	if len(sc.Ports) < 2 || sc.Ports[0].ContainerPort != listenPort(env, "TIMING_SIDECAR_LISTEN", proxy.DefaultListen) ||
		ports["timing-admin"] != listenPort(env, "TIMING_SIDECAR_ADMIN_LISTEN", proxy.DefaultAdminListen) {
		t.Errorf("container ports %v do not match the listen addresses", sc.Ports)
	}
}

// checkSidecarProbes checks that the readiness and liveness probes ask the
// admin port for a path it serves.
func checkSidecarProbes(t *testing.T, sc *corev1.Container) {
	t.Helper()
	p, err := proxy.New(proxy.DefaultConfig(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, probe := range map[string]*corev1.Probe{"readiness": sc.ReadinessProbe, "liveness": sc.LivenessProbe} {
		if probe == nil || probe.HTTPGet == nil {
			t.Fatalf("no HTTP %s probe", name)
		}
		if probe.HTTPGet.Port.StrVal != "timing-admin" {
			t.Errorf("%s probe on port %v, want the admin port", name, probe.HTTPGet.Port.String())
		}
		rec := httptest.NewRecorder()
		p.AdminHandler().ServeHTTP(rec, httptest.NewRequest("GET", probe.HTTPGet.Path, nil))
		if rec.Code == http.StatusNotFound || rec.Code == http.StatusMethodNotAllowed {
			t.Errorf("%s probe path %s is not served by the admin port", name, probe.HTTPGet.Path)
		}
	}
}

// checkShutdownGrace checks that Kubernetes waits longer than the sidecar's
// shutdown grace before it kills the pod.
func checkShutdownGrace(t *testing.T, spec *corev1.PodSpec, env map[string]string) {
	t.Helper()
	grace := proxy.DefaultShutdownGrace
	if v, ok := env["TIMING_SIDECAR_SHUTDOWN_GRACE"]; ok {
		var err error
		if grace, err = time.ParseDuration(v); err != nil {
			t.Fatalf("TIMING_SIDECAR_SHUTDOWN_GRACE %q: %v", v, err)
		}
	}
	if spec.TerminationGracePeriodSeconds == nil || time.Duration(*spec.TerminationGracePeriodSeconds)*time.Second <= grace {
		t.Errorf("terminationGracePeriodSeconds %v must be set and longer than the shutdown grace %v", spec.TerminationGracePeriodSeconds, grace)
	}
}

func TestExample(t *testing.T) {
	var all []byte
	files, _ := filepath.Glob("example/*.yaml")
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" || filepath.Base(f) == "vllm.yaml" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		decode(t, f, b)
		all = append(append(all, b...), "\n---\n"...)
	}
	built := build(t, "example")
	if len(built.deployments) != 1 || len(built.services) != 1 || len(built.monitors) != 1 {
		t.Fatalf("example builds to %d deployments, %d services, %d monitors", len(built.deployments), len(built.services), len(built.monitors))
	}
	d := built.deployments[0]
	sc := checkSidecar(t, &d.Spec.Template.Spec)
	gpu := d.Spec.Template.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"]
	if got := d.Spec.Template.Spec.Containers[0]; got.Name != "vllm" || gpu.IsZero() ||
		!strings.Contains(strings.Join(got.Args, " "), "--model") || got.Ports[0].ContainerPort != 18000 {
		t.Errorf("vLLM container %+v", got)
	}
	svc := built.services[0]
	if tp := svc.Spec.Ports[0].TargetPort; tp != intstr.FromString(sc.Ports[0].Name) && tp != intstr.FromInt32(sc.Ports[0].ContainerPort) {
		t.Errorf("the Service sends clients to %v, not the sidecar (%v)", tp, sc.Ports[0])
	}
	if d.Spec.Template.Annotations["prometheus.io/port"] != "9101" {
		t.Error("no Prometheus scrape annotations on the admin port")
	}
	for _, ep := range built.monitors[0].Spec.Endpoints {
		found := false
		for _, p := range svc.Spec.Ports {
			found = found || p.Name == ep.Port
		}
		if !found {
			t.Errorf("ServiceMonitor scrapes port %q the Service does not have", ep.Port)
		}
	}
	if !bytes.Contains(all, []byte("TIMING_SIDECAR_")) {
		t.Error("settings are not given as env vars")
	}
}

var update = flag.Bool("update", false, "write the example's PrometheusRule from deploy/prometheus, and its Deployment from vllm.yaml")

const (
	rulesFile          = "../prometheus/timing-sidecar-rules.yaml"
	prometheusRuleFile = "example/prometheusrule.yaml"
)

// TestPrometheusRuleIsTheRulesFile keeps the example's PrometheusRule the
// same groups as deploy/prometheus/timing-sidecar-rules.yaml, which
// promtool and a real Prometheus check in the e2e tests.
func TestPrometheusRuleIsTheRulesFile(t *testing.T) {
	raw, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var want ruleGroups
	if err := yaml.UnmarshalStrict(raw, &want); err != nil {
		t.Fatal(err)
	}
	if *update {
		r := prometheusRule{APIVersion: "monitoring.coreos.com/v1", Kind: "PrometheusRule", Spec: want}
		r.Metadata.Name = "timing-sidecar"
		r.Metadata.Labels = map[string]string{"app.kubernetes.io/name": "vllm"}
		out, err := yaml.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		header := "# Generated from deploy/prometheus/timing-sidecar-rules.yaml by\n# `go test ./deploy/kubernetes -update`: edit that file, not this one.\n# For the Prometheus Operator; drop it from the kustomization without it.\n"
		if err := os.WriteFile(prometheusRuleFile, append([]byte(header), out...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	built := build(t, "example")
	if len(built.rules) != 1 {
		t.Fatalf("the example has %d PrometheusRules", len(built.rules))
	}
	if !reflect.DeepEqual(built.rules[0].Spec, want) {
		t.Errorf("%s differs from %s: run go test ./deploy/kubernetes -update", prometheusRuleFile, rulesFile)
	}
	for _, g := range want.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" && (r.Annotations["summary"] == "" || r.Annotations["description"] == "" || r.Annotations["runbook_url"] == "") {
				t.Errorf("alert %s lacks a summary, a description or a runbook", r.Alert)
			}
		}
	}
}

// TestTracingVariant builds the example with traces on: the sidecar and
// vLLM send to the same collector.
func TestTracingVariant(t *testing.T) {
	built := build(t, "tracing")
	if len(built.deployments) != 1 {
		t.Fatalf("built %d deployments", len(built.deployments))
	}
	spec := &built.deployments[0].Spec.Template.Spec
	sc := checkSidecar(t, spec)
	env := envOf(sc)
	endpoint := env["TIMING_SIDECAR_OTLP_TRACES_ENDPOINT"]
	args := strings.Join(spec.Containers[0].Args, " ")
	if endpoint == "" || !strings.Contains(args, "--otlp-traces-endpoint "+endpoint) {
		t.Errorf("sidecar endpoint %q, vLLM args %q: want both on one collector", endpoint, args)
	}
	if !strings.Contains(env["OTEL_RESOURCE_ATTRIBUTES"], "k8s.pod.name=$(POD_NAME)") {
		t.Errorf("resource attributes %q", env["OTEL_RESOURCE_ATTRIBUTES"])
	}
	if env["TIMING_SIDECAR_OTLP_METRICS_ENDPOINT"] != endpoint {
		t.Errorf("metrics endpoint %q, want the traces' collector %q", env["TIMING_SIDECAR_OTLP_METRICS_ENDPOINT"], endpoint)
	}
}

// TestInjectIntoAnExistingDeployment: a plain vLLM Deployment and Service
// named differently from the example, as a user's are, through inject
// (kubectl get -o yaml | timing-sidecar inject | kubectl apply -f -).
func TestInjectIntoAnExistingDeployment(t *testing.T) {
	in, err := os.ReadFile("testdata/existing-vllm/vllm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := inject.Inject(bytes.NewReader(in), &out, inject.Options{}); err != nil {
		t.Fatal(err)
	}
	built := decode(t, "injected", out.Bytes())
	if len(built.deployments) != 1 || len(built.services) != 1 {
		t.Fatalf("%d deployments and %d services", len(built.deployments), len(built.services))
	}
	d := built.deployments[0]
	if d.Name != "llama" || d.Spec.Template.Annotations["team"] != "search" {
		t.Errorf("the user's Deployment changed: %s %v", d.Name, d.Spec.Template.Annotations)
	}
	spec := &d.Spec.Template.Spec
	sc := checkSidecar(t, spec)
	if len(spec.Containers) != 1 || spec.Containers[0].Name != "vllm" || spec.Containers[0].Args[1] != "meta-llama/Llama-3.1-8B-Instruct" {
		t.Errorf("the user's vLLM container: %+v", spec.Containers)
	}
	// The Service is untouched, and its target port is now the sidecar's.
	svc := built.services[0]
	if svc.Name != "llama" || svc.Spec.Ports[0].Port != 80 || svc.Spec.Ports[0].TargetPort != intstr.FromInt32(sc.Ports[0].ContainerPort) {
		t.Errorf("Service %s port %d -> %v; the sidecar serves %d", svc.Name, svc.Spec.Ports[0].Port, svc.Spec.Ports[0].TargetPort, sc.Ports[0].ContainerPort)
	}
}

// TestTLSVariant builds the example serving HTTPS: the sidecar serves the
// Secret's certificate, mounted read-only, and vLLM listens on loopback
// only, its probes asking the sidecar.
func TestTLSVariant(t *testing.T) {
	built := build(t, "tls")
	if len(built.deployments) != 1 {
		t.Fatalf("built %d deployments", len(built.deployments))
	}
	spec := &built.deployments[0].Spec.Template.Spec
	sc := checkSidecar(t, spec)
	env := envOf(sc)
	var mount string
	for _, m := range sc.VolumeMounts {
		if m.Name == "tls" && m.ReadOnly {
			mount = m.MountPath
		}
	}
	secret := false
	for _, v := range spec.Volumes {
		secret = secret || v.Name == "tls" && v.Secret != nil && v.Secret.SecretName != ""
	}
	if mount == "" || !secret || !strings.HasPrefix(env["TIMING_SIDECAR_SSL_CERTFILE"], mount+"/") || !strings.HasPrefix(env["TIMING_SIDECAR_SSL_KEYFILE"], mount+"/") {
		t.Errorf("certificate %q and key %q not from a Secret mounted read-only (%q)", env["TIMING_SIDECAR_SSL_CERTFILE"], env["TIMING_SIDECAR_SSL_KEYFILE"], mount)
	}
	vllm := spec.Containers[0]
	if args := strings.Join(vllm.Args, " "); !strings.Contains(args, "--host 127.0.0.1") {
		t.Errorf("vLLM args %q: want it on loopback", args)
	}
	for _, p := range []*corev1.Probe{vllm.ReadinessProbe, vllm.StartupProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Port.StrVal != "timing-admin" || p.HTTPGet.Path != "/readyz" {
			t.Errorf("a vLLM probe that cannot reach it on loopback: %+v", p)
		}
	}
}

// envOf is a container's environment, by name.
func envOf(c *corev1.Container) map[string]string {
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	return env
}

// exampleSettings are the sidecar's settings in the example, beside the
// ones its container spec (deploy/inject/sidecar.yaml) sets.
var exampleSettings = []inject.EnvVar{
	// "true": non-streaming requests are streamed from the engine and
	// reassembled, so they get TTFT and ITL too.
	{Name: "TIMING_SIDECAR_UPGRADE_NON_STREAMING", Value: "false"},
	// Latency objectives for goodput; 0s sets none. Set them to your SLA.
	{Name: "TIMING_SIDECAR_SLO_TTFT", Value: "0s"},
	{Name: "TIMING_SIDECAR_SLO_ITL", Value: "0s"},
	{Name: "TIMING_SIDECAR_SLO_E2E", Value: "0s"},
	{Name: "TIMING_SIDECAR_LOG_LEVEL", Value: "info"},
}

// TestExampleIsInjected keeps the example's Deployment what inject makes
// of vllm.yaml: one source for the sidecar's container, one port model.
func TestExampleIsInjected(t *testing.T) {
	in, err := os.ReadFile("example/vllm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	out.WriteString("# Generated by timing-sidecar inject from vllm.yaml (go test ./deploy/kubernetes -update); edit vllm.yaml.\n")
	if err := inject.Inject(bytes.NewReader(in), &out, inject.Options{Env: exampleSettings}); err != nil {
		t.Fatal(err)
	}
	const file = "example/deployment.yaml"
	if *update {
		os.WriteFile(file, out.Bytes(), 0o644)
	}
	got, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, out.Bytes()) {
		t.Errorf("%s is not what inject makes of vllm.yaml: run go test ./deploy/kubernetes -update", file)
	}
}
