package inject

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
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
			checkOutput(t, string(in), got, Options{})
		})
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

// TestEnginesByCommandNameAndPort: which containers are engines, and the
// address the sidecar takes over: the engine's, loopback for an engine
// whose default host is loopback (SGLang, llama-server outside its
// image).
func TestEnginesByCommandNameAndPort(t *testing.T) {
	pod := func(container string) string {
		return "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n" + container
	}
	for _, tc := range []struct {
		name, container string
		opts            Options
		engine          bool
		listen          string // the sidecar's: where the engine listened
	}{
		{"vllm serve", "    - name: e\n      command: [vllm, serve, m]\n", Options{}, true, ":8000"},
		{"vLLM's entrypoint module", "    - name: e\n      command: [python3, -m, vllm.entrypoints.openai.api_server, --port=9000]\n", Options{}, true, ":9000"},
		{"SGLang", "    - name: e\n      command: [python3, -m, sglang.launch_server, --model-path, m]\n", Options{}, true, "127.0.0.1:30000"},
		{"SGLang on every interface", "    - name: e\n      command: [python3, -m, sglang.launch_server, --model-path, m, --host, 0.0.0.0]\n", Options{}, true, ":30000"},
		{"llama-server", "    - name: e\n      command: [llama-server, -m, m.gguf, --port, \"8081\"]\n", Options{}, true, "127.0.0.1:8081"},
		{"llama-server in its image", "    - name: e\n      image: ghcr.io/ggml-org/llama.cpp:server-cuda\n      command: [/app/llama-server, -m, m.gguf]\n", Options{}, true, ":8080"},
		{"TGI", "    - name: e\n      args: [text-generation-launcher, --model-id, m]\n      ports: [{containerPort: 3000}]\n", Options{}, true, ":3000"},
		{"vLLM's image, args only", "    - name: e\n      image: vllm/vllm-openai:v0.11.0\n      args: [--model, m]\n", Options{}, true, ":8000"},
		{"TGI's image, args only", "    - name: e\n      image: ghcr.io/huggingface/text-generation-inference:3.3\n      args: [--model-id, m]\n", Options{}, true, ":80"},
		{"vLLM's image running something else", "    - name: e\n      image: vllm/vllm-openai:v0.11.0\n      command: [python3, bench.py]\n", Options{}, false, ""},
		{"a program not known", "    - name: e\n      command: [my-server]\n      ports: [{containerPort: 7000}]\n", Options{}, false, ""},
		{"named", "    - name: e\n      command: [my-server, --port, \"7000\"]\n      ports: [{containerPort: 7000}]\n", Options{EngineContainer: "e"}, true, ":7000"},
		{"by port", "    - name: e\n      command: [my-server, --port, \"7000\"]\n      ports: [{containerPort: 7000}]\n", Options{EnginePort: 7000}, true, ":7000"},
		{"a router on the port is not an engine", "    - name: r\n      image: lmcache/lmstack-router:latest\n      command: [vllm-router, --port, \"7000\"]\n      ports: [{containerPort: 7000}]\n", Options{EnginePort: 7000}, false, ""},
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
		if got := sidecarEnv(p.Spec)["TIMING_SIDECAR_LISTEN"]; got != tc.listen {
			t.Errorf("%s: the sidecar listens on %q, want %q:\n%s", tc.name, got, tc.listen, out)
		}
		checkOutput(t, pod(tc.container), out, tc.opts)
	}
}

// sidecarEnv is the sidecar's env values by name.
func sidecarEnv(spec corev1.PodSpec) map[string]string {
	env := map[string]string{}
	if c := findSidecar(spec); c != nil {
		for _, e := range c.Env {
			env[e.Name] = e.Value
		}
	}
	return env
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
	for _, name := range []string{"TIMING_SIDECAR_LISTEN", "TIMING_SIDECAR_UPSTREAM"} {
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
