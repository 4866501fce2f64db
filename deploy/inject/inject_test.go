package inject

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	sigsyaml "sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func injectString(t *testing.T, in string, opts Options) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := Inject(strings.NewReader(in), &out, opts)
	return out.String(), err
}

// TestStacks injects each stack's rendered manifests: the output is the
// golden file, valid Kubernetes objects, the same when injected again, and
// every Service port and probe that reached the engine reaches the
// sidecar, or the engine itself for the engine's own probes.
func TestStacks(t *testing.T) {
	for _, stack := range []string{"production-stack", "llm-d", "kserve", "leaderworkerset", "plain"} {
		t.Run(stack, func(t *testing.T) {
			in, err := os.ReadFile(filepath.Join("testdata", stack+".yaml"))
			if err != nil {
				t.Fatal(err)
			}
			got, err := injectString(t, string(in), Options{})
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", stack+".golden.yaml")
			if *update {
				os.WriteFile(golden, []byte(got), 0o644)
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if got != string(want) {
				t.Errorf("differs from %s (go test ./deploy/inject -update):\n%s", golden, got)
			}
			again, err := injectString(t, got, Options{})
			if err != nil || again != got {
				t.Errorf("injecting twice is not injecting once (%v):\n%s", err, again)
			}
			checkObjects(t, got)
		})
	}
}

// checkObjects decodes every document of out into its Kubernetes type,
// refusing unknown fields, and follows the traffic: each pod with the
// sidecar has the engine behind it, and the Services' named target ports
// are the sidecar's.
func checkObjects(t *testing.T, out string) {
	t.Helper()
	sidecarPorts := map[string]int32{}
	var targets []intstr.IntOrString
	for _, doc := range strings.Split(out, "\n---\n") {
		var meta struct{ Kind string }
		if err := sigsyaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		var pods []corev1.PodSpec
		switch meta.Kind {
		case "Deployment":
			var d appsv1.Deployment
			strict(t, doc, &d)
			pods = append(pods, d.Spec.Template.Spec)
		case "Service":
			var s corev1.Service
			strict(t, doc, &s)
			for _, p := range s.Spec.Ports {
				targets = append(targets, p.TargetPort)
			}
		case "LeaderWorkerSet":
			// Not in k8s.io/api: the fields inject relies on, the pod
			// templates, decode as core types.
			var lws struct {
				Spec struct {
					LeaderWorkerTemplate struct {
						LeaderTemplate, WorkerTemplate corev1.PodTemplateSpec
					} `json:"leaderWorkerTemplate"`
				}
			}
			if err := sigsyaml.Unmarshal([]byte(doc), &lws); err != nil {
				t.Fatal(err)
			}
			pods = append(pods, lws.Spec.LeaderWorkerTemplate.LeaderTemplate.Spec, lws.Spec.LeaderWorkerTemplate.WorkerTemplate.Spec)
		case "ServingRuntime":
			var sr struct {
				Spec struct {
					Containers []corev1.Container `json:"containers"`
				}
			}
			if err := sigsyaml.Unmarshal([]byte(doc), &sr); err != nil {
				t.Fatal(err)
			}
			pods = append(pods, corev1.PodSpec{Containers: sr.Spec.Containers})
		}
		for _, pod := range pods {
			for name, port := range checkPod(t, pod) {
				sidecarPorts[name] = port
			}
		}
	}
	for _, tp := range targets {
		if tp.Type == intstr.String {
			if _, ok := sidecarPorts[tp.StrVal]; !ok && len(sidecarPorts) > 0 {
				t.Errorf("a Service targets port %q, which is not the sidecar's (%v)", tp.StrVal, sidecarPorts)
			}
		}
	}
}

func strict(t *testing.T, doc string, v any) {
	t.Helper()
	if err := sigsyaml.UnmarshalStrict([]byte(doc), v); err != nil {
		t.Fatalf("not a valid object: %v\n%s", err, doc)
	}
}

// checkPod checks a pod with the sidecar: the sidecar listens where the
// engine did and relays to where the engine listens now; the engine's
// probes test the engine. It returns the sidecar's named ports.
func checkPod(t *testing.T, pod corev1.PodSpec) map[string]int32 {
	t.Helper()
	sidecar, native := findSidecar(pod)
	if sidecar == nil {
		return nil
	}
	enginePort := checkSidecarAddresses(t, sidecar)
	checkEngines(t, pod, enginePort)
	if native && (pod.TerminationGracePeriodSeconds == nil || *pod.TerminationGracePeriodSeconds < MinGracePeriod) {
		t.Errorf("terminationGracePeriodSeconds %v", pod.TerminationGracePeriodSeconds)
	}
	named := map[string]int32{}
	for _, p := range sidecar.Ports {
		named[p.Name] = p.ContainerPort
	}
	return named
}

// findSidecar returns the pod's sidecar, or nil, and whether it is native:
// an init container, not one of KServe's containers.
func findSidecar(pod corev1.PodSpec) (sidecar *corev1.Container, native bool) {
	for i := range pod.InitContainers {
		if pod.InitContainers[i].Name == Name {
			sidecar, native = &pod.InitContainers[i], true
		}
	}
	for i := range pod.Containers {
		if pod.Containers[i].Name == Name {
			sidecar = &pod.Containers[i]
		}
	}
	return sidecar, native
}

// checkSidecarAddresses checks that the sidecar listens on its first port
// and relays to the engine on loopback, and returns the engine's port.
func checkSidecarAddresses(t *testing.T, sidecar *corev1.Container) int {
	t.Helper()
	env := map[string]string{}
	for _, e := range sidecar.Env {
		env[e.Name] = e.Value
	}
	listen, upstream := env["TIMING_SIDECAR_LISTEN"], env["TIMING_SIDECAR_UPSTREAM"]
	if sidecar.Ports[0].ContainerPort == 0 || listen != ":"+strconv.Itoa(int(sidecar.Ports[0].ContainerPort)) {
		t.Errorf("the sidecar listens on %s, its port is %d", listen, sidecar.Ports[0].ContainerPort)
	}
	enginePort, err := strconv.Atoi(strings.TrimPrefix(upstream, "http://127.0.0.1:"))
	if err != nil {
		t.Fatalf("upstream %q", upstream)
	}
	return enginePort
}

// checkEngines checks that there is an engine beside the sidecar, and
// that every engine (a container with a --port) listens on enginePort and
// has its probes test it there.
func checkEngines(t *testing.T, pod corev1.PodSpec, enginePort int) {
	t.Helper()
	found := false
	for _, c := range pod.Containers {
		if c.Name == Name || !strings.Contains(strings.Join(append(c.Command, c.Args...), " "), "--port") {
			continue
		}
		found = true
		line := strings.Join(append(c.Command, c.Args...), " ")
		if !strings.Contains(line, "--port "+strconv.Itoa(enginePort)) && !strings.Contains(line, "--port="+strconv.Itoa(enginePort)) {
			t.Errorf("the engine %s does not listen on %d: %s", c.Name, enginePort, line)
		}
		checkEngineProbes(t, c, enginePort)
	}
	if !found {
		t.Errorf("no engine with a --port beside the sidecar")
	}
}

// checkEngineProbes checks that each of the engine's probes tests
// enginePort.
func checkEngineProbes(t *testing.T, c corev1.Container, enginePort int) {
	t.Helper()
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
		if p == nil {
			continue
		}
		var port intstr.IntOrString
		switch {
		case p.HTTPGet != nil:
			port = p.HTTPGet.Port
		case p.TCPSocket != nil:
			port = p.TCPSocket.Port
		}
		if port.IntValue() != enginePort {
			t.Errorf("the engine's probe tests port %v, not the engine's %d", port.String(), enginePort)
		}
	}
}

// TestBadInputIsAnErrorAndWritesNothing: input inject cannot handle
// safely is an error that names the document and the reason, and nothing
// is written.
func TestBadInputIsAnErrorAndWritesNothing(t *testing.T) {
	deployment := func(spec string) string {
		return "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d\nspec:\n  template:\n    spec:\n" + spec
	}
	for _, tc := range []struct {
		name, in, want string
	}{
		{"no engine anywhere", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n", "no engine found"},
		{"two candidate engines in one pod", deployment("      containers:\n        - name: a\n          command: [vllm, serve, m]\n        - name: b\n          command: [llama-server]\n"),
			`document 1 (Deployment "d", spec.template.spec): two containers could be the engine, "a" and "b"`},
		{"an engine on hostNetwork", deployment("      hostNetwork: true\n      containers:\n        - name: a\n          command: [vllm, serve, m]\n"),
			`document 1 (Deployment "d", spec.template.spec): the engine's pod is on hostNetwork`},
		{"YAML that does not parse", "kind: Deployment\nspec: [unclosed\n", "read the manifests"},
		{"the second document bad, the first fine", deployment("      containers:\n        - name: a\n          command: [vllm, serve, m]\n") + "---\n" +
			deployment("      hostNetwork: true\n      containers:\n        - name: a\n          command: [vllm, serve, m]\n"), "document 2"},
	} {
		got, err := injectString(t, tc.in, Options{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one saying %q", tc.name, err, tc.want)
		}
		if got != "" {
			t.Errorf("%s: wrote %q", tc.name, got)
		}
	}
}

// TestEnginesByCommandNameAndPort: which containers are engines.
func TestEnginesByCommandNameAndPort(t *testing.T) {
	pod := func(container string) string {
		return "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n" + container
	}
	for _, tc := range []struct {
		name, container string
		opts            Options
		engine          bool
		port            int // the sidecar's: where the engine listened
	}{
		{"vllm serve", "    - name: e\n      command: [vllm, serve, m]\n", Options{}, true, 8000},
		{"vLLM's entrypoint module", "    - name: e\n      command: [python3, -m, vllm.entrypoints.openai.api_server, --port=9000]\n", Options{}, true, 9000},
		{"SGLang", "    - name: e\n      command: [python3, -m, sglang.launch_server, --model-path, m]\n", Options{}, true, 30000},
		{"llama-server", "    - name: e\n      command: [llama-server, -m, m.gguf, --port, \"8081\"]\n", Options{}, true, 8081},
		{"TGI", "    - name: e\n      args: [text-generation-launcher, --model-id, m]\n      ports: [{containerPort: 80}]\n", Options{}, true, 80},
		{"vLLM's image, args only", "    - name: e\n      image: vllm/vllm-openai:v0.11.0\n      args: [--model, m]\n", Options{}, true, 8000},
		{"TGI's image, args only", "    - name: e\n      image: ghcr.io/huggingface/text-generation-inference:3.3\n      args: [--model-id, m]\n", Options{}, true, 80},
		{"vLLM's image running something else", "    - name: e\n      image: vllm/vllm-openai:v0.11.0\n      command: [python3, bench.py]\n", Options{}, false, 0},
		{"a program not known", "    - name: e\n      command: [my-server]\n      ports: [{containerPort: 7000}]\n", Options{}, false, 0},
		{"named", "    - name: e\n      command: [my-server, --port, \"7000\"]\n      ports: [{containerPort: 7000}]\n", Options{EngineContainer: "e"}, true, 7000},
		{"by port", "    - name: e\n      command: [my-server, --port, \"7000\"]\n      ports: [{containerPort: 7000}]\n", Options{EnginePort: 7000}, true, 7000},
		{"a router on the port is not an engine", "    - name: r\n      image: lmcache/lmstack-router:latest\n      command: [vllm-router, --port, \"7000\"]\n      ports: [{containerPort: 7000}]\n", Options{EnginePort: 7000}, false, 0},
	} {
		out, err := injectString(t, pod(tc.container), tc.opts)
		if !tc.engine {
			if err != ErrNoEngine {
				t.Errorf("%s: %v, want no engine", tc.name, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var p corev1.Pod
		strict(t, out, &p)
		if len(p.Spec.InitContainers) != 1 || p.Spec.InitContainers[0].Ports[0].ContainerPort != int32(tc.port) {
			t.Errorf("%s: the sidecar does not take port %d:\n%s", tc.name, tc.port, out)
		}
	}
}

// TestOnlyTheEnginesOwnPortMoves: in a shell line, the engine's --port
// moves, another program's on the same line does not; an engine without
// --port gets one.
func TestOnlyTheEnginesOwnPortMoves(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"ray start --head --port 6379; vllm serve m --port 8000 --tp 8; echo --port 1", "ray start --head --port 6379; vllm serve m --port 18000 --tp 8; echo --port 1"},
		{"ray start --port=6379 && vllm serve m --port=8000", "ray start --port=6379 && vllm serve m --port=18000"},
		{"ray start --port 6379 && exec vllm serve m", "ray start --port 6379 && exec vllm serve m --port 18000"},
		{"vllm serve m \\\n  --port 8000 \\\n  --tp 2\n", "vllm serve m \\\n  --port 18000 \\\n  --tp 2\n"},
	} {
		in := "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n    - name: e\n      command: [sh, -c]\n      args:\n        - " + strconv.Quote(tc.in) + "\n"
		out, err := injectString(t, in, Options{})
		if err != nil {
			t.Fatalf("%q: %v", tc.in, err)
		}
		var p corev1.Pod
		strict(t, out, &p)
		if got := p.Spec.Containers[0].Args[0]; got != tc.want {
			t.Errorf("%q became\n%q, want\n%q", tc.in, got, tc.want)
		}
	}
}

// TestSettings: --set settings reach the sidecar as env vars, in place
// of the template's where it has them.
func TestSettings(t *testing.T) {
	out, err := injectString(t, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n    - name: e\n      command: [vllm, serve, m]\n",
		Options{Image: "registry.local/timing-sidecar:1.2.3", Env: []EnvVar{{"TIMING_SIDECAR_PER_REQUEST_METRICS", "always"}, {"TIMING_SIDECAR_SLO_TTFT", "2s"}}})
	if err != nil {
		t.Fatal(err)
	}
	var p corev1.Pod
	strict(t, out, &p)
	sc := p.Spec.InitContainers[0]
	env := map[string]string{}
	count := map[string]int{}
	for _, e := range sc.Env {
		env[e.Name] = e.Value
		count[e.Name]++
	}
	if sc.Image != "registry.local/timing-sidecar:1.2.3" || env["TIMING_SIDECAR_PER_REQUEST_METRICS"] != "always" || env["TIMING_SIDECAR_SLO_TTFT"] != "2s" ||
		count["TIMING_SIDECAR_PER_REQUEST_METRICS"] != 1 {
		t.Errorf("image %s, env %v", sc.Image, sc.Env)
	}
	if sc.RestartPolicy == nil || *sc.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Error("not a native sidecar")
	}
}

// TestSettingsInjectDerives: a longer shutdown grace lengthens the pod's
// grace to match; the ports inject works out from the pod cannot be set.
func TestSettingsInjectDerives(t *testing.T) {
	pod := "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n    - name: e\n      command: [vllm, serve, m]\n"
	for grace, want := range map[string]int64{"300s": 320, "10s": MinGracePeriod, "5m30.5s": 351} {
		out, err := injectString(t, pod, Options{Env: []EnvVar{{"TIMING_SIDECAR_SHUTDOWN_GRACE", grace}}})
		if err != nil {
			t.Fatal(err)
		}
		var p corev1.Pod
		strict(t, out, &p)
		if got := p.Spec.TerminationGracePeriodSeconds; got == nil || *got != want {
			t.Errorf("shutdown grace %s: pod grace %v, want %d", grace, got, want)
		}
	}
	for _, name := range []string{"TIMING_SIDECAR_LISTEN", "TIMING_SIDECAR_UPSTREAM", "TIMING_SIDECAR_ADMIN_LISTEN"} {
		if _, err := injectString(t, pod, Options{Env: []EnvVar{{name, ":9200"}}}); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s set: %v, want an error naming it", name, err)
		}
	}
}

// TestResourceList: as a KRM function (kustomize's exec transformer), a
// ResourceList comes back a ResourceList with its items injected.
func TestResourceList(t *testing.T) {
	in := `apiVersion: config.kubernetes.io/v1
kind: ResourceList
items:
  - apiVersion: v1
    kind: Pod
    metadata:
      name: p
    spec:
      containers:
        - name: e
          command: [vllm, serve, m]
`
	out, err := injectString(t, in, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var rl struct {
		Kind  string
		Items []corev1.Pod
	}
	if err := sigsyaml.Unmarshal([]byte(out), &rl); err != nil {
		t.Fatal(err)
	}
	if rl.Kind != "ResourceList" || len(rl.Items) != 1 || len(rl.Items[0].Spec.InitContainers) != 1 || rl.Items[0].Spec.InitContainers[0].Name != Name {
		t.Errorf("got:\n%s", out)
	}
}
