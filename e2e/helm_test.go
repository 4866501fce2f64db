package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/timing-sidecar/timing-sidecar/e2e/needs"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

// The post-renderer test renders a chart shaped like vLLM
// production-stack's (e2e/testdata/engine-stack: the engine on 8000 in its
// args, containerPort and probes, a Service on its named port, and a
// router on 8000 too) with a real Helm: the Helm 4 CLI, built from the
// module proxy by e2e/helm, with the plugin in deploy/helm/timing-sidecar
// running the release binary's inject.

// helm runs the Helm CLI with its plugins, cache and config in a test
// directory, and the sidecar's binary on PATH, as a user who installed it.
func helm(t *testing.T, home string, args ...string) (string, error) {
	t.Helper()
	path, err := needs.Helm.Path()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), "HELM_PLUGINS="+filepath.Join(home, "data", "plugins"), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"),
		"PATH="+filepath.Dir(binary)+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestHelmPostRenderer(t *testing.T) {
	home := t.TempDir()
	if out, err := helm(t, home, "plugin", "install", "../deploy/helm/timing-sidecar"); err != nil {
		t.Fatalf("helm plugin install: %v\n%s", err, out)
	}
	out, err := helm(t, home, "template", "llama", "testdata/engine-stack", "--post-renderer", "timing-sidecar",
		"--post-renderer-args", "--set", "--post-renderer-args", "per-request-metrics=always")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	engine, router, services := parseRenderedStack(t, out)
	if engine == nil || router == nil || len(services) != 2 {
		t.Fatalf("rendered %v, %v, %d services:\n%s", engine, router, len(services), out)
	}
	checkSidecarTookEnginePort(t, engine, out)
	// The router, on the same port, is not an engine: untouched.
	if rp := router.Spec.Template.Spec; len(rp.InitContainers) != 0 || len(rp.Containers) != 1 || rp.Containers[0].Ports[0].ContainerPort != 8000 {
		t.Errorf("the router changed: %+v", rp)
	}
	for _, s := range services {
		if tp := s.Spec.Ports[0].TargetPort.StrVal; tp != "container-port" && tp != "router-cport" {
			t.Errorf("service %s targets %v", s.Name, s.Spec.Ports[0].TargetPort)
		}
	}

	// A chart that renders no engine: Helm fails, rendering nothing.
	// (Helm 4.3 drops a post-renderer's standard error, so the reason is
	// not in its message; inject itself gives it.)
	out, err = helm(t, home, "template", "llama", "testdata/engine-stack", "--set", "engine=false", "--post-renderer", "timing-sidecar")
	if err == nil || !strings.Contains(out, `post-renderer plugin "timing-sidecar"`) || strings.Contains(out, "kind: Deployment") {
		t.Errorf("no engine: %v\n%s", err, out)
	}
}

// parseRenderedStack reads Helm's output: the engine's Deployment (named
// -vllm), the router's, and the Services. Each must be valid.
func parseRenderedStack(t *testing.T, out string) (engine, router *appsv1.Deployment, services []corev1.Service) {
	t.Helper()
	for _, doc := range strings.Split(out, "\n---\n") {
		var meta struct {
			Kind     string
			Metadata struct{ Name string }
		}
		if err := sigsyaml.Unmarshal([]byte(doc), &meta); err != nil || meta.Kind == "" {
			continue
		}
		switch meta.Kind {
		case "Deployment":
			var d appsv1.Deployment
			if err := sigsyaml.UnmarshalStrict([]byte(doc), &d); err != nil {
				t.Fatalf("not a valid Deployment: %v\n%s", err, doc)
			}
			if strings.HasSuffix(d.Name, "-vllm") {
				engine = &d
			} else {
				router = &d
			}
		case "Service":
			var s corev1.Service
			if err := sigsyaml.UnmarshalStrict([]byte(doc), &s); err != nil {
				t.Fatalf("not a valid Service: %v\n%s", err, doc)
			}
			services = append(services, s)
		}
	}
	return engine, router, services
}

// checkSidecarTookEnginePort: the sidecar holds the engine's port and its
// name, which the Service targets; the engine and its probes moved
// together.
func checkSidecarTookEnginePort(t *testing.T, engine *appsv1.Deployment, out string) {
	t.Helper()
	pod := engine.Spec.Template.Spec
	if len(pod.InitContainers) != 1 || pod.InitContainers[0].Name != "timing-sidecar" {
		t.Fatalf("no sidecar in the engine's pod:\n%s", out)
	}
	sc := pod.InitContainers[0]
	env := map[string]string{}
	for _, e := range sc.Env {
		env[e.Name] = e.Value
	}
	if sc.Ports[0].Name != "container-port" || sc.Ports[0].ContainerPort != 8000 || env["TIMING_SIDECAR_LISTEN"] != ":8000" ||
		env["TIMING_SIDECAR_UPSTREAM"] != "http://127.0.0.1:18000" || env["TIMING_SIDECAR_PER_REQUEST_METRICS"] != "always" {
		t.Errorf("sidecar ports %v, env %v", sc.Ports, env)
	}
	vllm := pod.Containers[0]
	if got := strings.Join(vllm.Command, " "); !strings.Contains(got, "--port 18000") || vllm.Ports[0].ContainerPort != 18000 ||
		vllm.StartupProbe.HTTPGet.Port.IntValue() != 18000 || vllm.LivenessProbe.HTTPGet.Port.IntValue() != 18000 {
		t.Errorf("engine %q, ports %v, probes %v %v", got, vllm.Ports, vllm.StartupProbe.HTTPGet.Port, vllm.LivenessProbe.HTTPGet.Port)
	}
	if engine.Spec.Template.Labels["model.aibrix.ai/port"] != "8000" {
		t.Errorf("labels %v", engine.Spec.Template.Labels)
	}
}
