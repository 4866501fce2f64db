package inject

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

// TestEveryKindsPodSpec: the sidecar lands in the pod spec where each
// kind keeps it, as a native sidecar except in KServe's kinds; kinds
// with no pod spec pass through.
func TestEveryKindsPodSpec(t *testing.T) {
	engine := "containers:\n- name: e\n  command: [vllm, serve, m]\n"
	indent := func(s string, n int) string {
		pad := strings.Repeat(" ", n)
		return pad + strings.ReplaceAll(strings.TrimSuffix(s, "\n"), "\n", "\n"+pad) + "\n"
	}
	for _, tc := range []struct {
		kind, apiVersion string
		path             []string // to the pod spec
		native           bool
	}{
		{"Pod", "v1", []string{"spec"}, true},
		{"Deployment", "apps/v1", []string{"spec", "template", "spec"}, true},
		{"StatefulSet", "apps/v1", []string{"spec", "template", "spec"}, true},
		{"DaemonSet", "apps/v1", []string{"spec", "template", "spec"}, true},
		{"ReplicaSet", "apps/v1", []string{"spec", "template", "spec"}, true},
		{"Job", "batch/v1", []string{"spec", "template", "spec"}, true},
		{"CronJob", "batch/v1", []string{"spec", "jobTemplate", "spec", "template", "spec"}, true},
		{"LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1", []string{"spec", "leaderWorkerTemplate", "leaderTemplate", "spec"}, true},
		{"LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1", []string{"spec", "leaderWorkerTemplate", "workerTemplate", "spec"}, true},
		{"ServingRuntime", "serving.kserve.io/v1alpha1", []string{"spec"}, false},
		{"ClusterServingRuntime", "serving.kserve.io/v1alpha1", []string{"spec"}, false},
		{"InferenceService", "serving.kserve.io/v1beta1", []string{"spec", "predictor"}, false},
	} {
		doc := "apiVersion: " + tc.apiVersion + "\nkind: " + tc.kind + "\nmetadata:\n  name: x\n"
		for i, p := range tc.path {
			doc += strings.Repeat("  ", i) + p + ":\n"
		}
		doc += indent(engine, 2*len(tc.path))
		out, err := injectString(t, doc, Options{})
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", tc.kind, tc.path, err, doc)
		}
		var v map[string]any
		if err := sigsyaml.Unmarshal([]byte(out), &v); err != nil {
			t.Fatal(err)
		}
		var node any = v
		for _, p := range tc.path {
			node = node.(map[string]any)[p]
		}
		pod := node.(map[string]any)
		list := "initContainers"
		if !tc.native {
			list = "containers"
		}
		found := false
		items, _ := pod[list].([]any)
		for _, c := range items {
			found = found || c.(map[string]any)["name"] == Name
		}
		if !found {
			t.Errorf("%s %v: no sidecar in %s:\n%s", tc.kind, tc.path, list, out)
		}
	}
	// A kind with no pod spec passes through, beside one that has one.
	out, err := injectString(t, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  containers: x\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  "+strings.ReplaceAll(engine, "\n", "\n  "), Options{})
	if err != nil || !strings.Contains(out, "kind: ConfigMap\nmetadata:\n  name: c\ndata:\n  containers: x\n") {
		t.Errorf("%v:\n%s", err, out)
	}
}

// TestUnreadKindsAreNamed: an engine in a kind inject does not read is
// refused with the kind, the container's path and what works instead,
// not with "no engine found"; so is the container --engine-container
// names there. A kind named like one inject reads, from another project,
// is not read as it.
func TestUnreadKindsAreNamed(t *testing.T) {
	const vllm = "- name: vllm\n  image: vllm/vllm-openai\n  args: [vllm, serve, m, --port, \"8000\"]\n  ports: [{containerPort: 8000}]\n"
	ind := func(s string, n int) string { return indent(s, strings.Repeat(" ", n)) }
	for _, tc := range []struct {
		name, doc string
		opts      Options
		want      []string
	}{
		{"KubeRay's RayCluster", "apiVersion: ray.io/v1\nkind: RayCluster\nmetadata:\n  name: rc\nspec:\n  headGroupSpec:\n    template:\n      spec:\n        containers:\n" + ind(vllm, 10),
			Options{}, []string{`document 1 (RayCluster "rc"): inject does not read RayCluster (ray.io/v1)`, `its container "vllm" at spec.headGroupSpec.template.spec.containers[0] runs vllm serve`, "KubeRay makes Services", "by hand"}},
		{"an OpenShift Template", "apiVersion: template.openshift.io/v1\nkind: Template\nmetadata:\n  name: t\nobjects:\n- apiVersion: apps/v1\n  kind: Deployment\n  metadata: {name: d}\n  spec:\n    template:\n      spec:\n        containers:\n" + ind(vllm, 10),
			Options{}, []string{"inject does not read Template", "objects[0].spec.template.spec.containers[0]", "oc process -f FILE | timing-sidecar inject"}},
		{"llmaz's Service", "apiVersion: inference.llmaz.io/v1alpha1\nkind: Service\nmetadata:\n  name: s\nspec:\n  template:\n    spec:\n      containers:\n" + ind(vllm, 8),
			Options{}, []string{"inject does not read Service (inference.llmaz.io/v1alpha1)", "spec.template.spec.containers[0]", "by hand"}},
		{"an engine by its image alone", "apiVersion: example.com/v1\nkind: Model\nmetadata:\n  name: m\nspec:\n  runner:\n    containers:\n    - name: main\n      image: vllm/vllm-openai:v0.11.0\n",
			Options{}, []string{"inject does not read Model", "spec.runner.containers[0] runs vLLM's image"}},
		{"--engine-container naming a container there", "apiVersion: example.com/v1\nkind: Model\nmetadata:\n  name: m\nspec:\n  runner:\n    containers:\n    - name: server\n      image: mine\n",
			Options{EngineContainer: "server"}, []string{`"server" at spec.runner.containers[0] is the one --engine-container names`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := injectString(t, tc.doc, tc.opts)
			for _, want := range tc.want {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("err = %v, want %q", err, want)
				}
			}
			if out != "" {
				t.Errorf("refused and wrote:\n%s", out)
			}
		})
	}
	// A kind with containers but no engine among them is not the reason.
	_, err := injectString(t, "apiVersion: example.com/v1\nkind: Job2\nmetadata:\n  name: j\nspec:\n  containers:\n  - name: x\n    image: busybox\n", Options{})
	if err != ErrNoEngine {
		t.Errorf("err = %v, want ErrNoEngine", err)
	}
}

// TestConfigMapsInTheInput: a container's envFrom that names a ConfigMap
// of the same input (and namespace) is read as the kubelet reads it;
// another source leaves the variable where inject cannot see.
func TestConfigMapsInTheInput(t *testing.T) {
	cm := func(ns string) string {
		return "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\n" + ns + "data:\n  PORT: \"9000\"\n  HOST: 0.0.0.0\n---\n"
	}
	pod := func(ns, envFrom string) string {
		return "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n" + ns + "spec:\n  containers:\n  - name: e\n    image: ghcr.io/ggml-org/llama.cpp:server\n    command: [llama-server, --port, $(PORT), --host, $(HOST)]\n    envFrom:\n" + envFrom
	}
	ns := "  namespace: a\n"
	for _, tc := range []struct{ name, in, listen, upstream, refusal string }{
		{"read from the input", cm(ns) + pod(ns, "    - configMapRef: {name: cfg}\n"), ":9000", "http://127.0.0.1:19000", ""},
		{"with a prefix", cm("") + pod(ns, "    - prefix: LLAMA_\n      configMapRef: {name: cfg}\n"), "", "", "cannot read the engine's port from --port $(PORT)"},
		{"in another namespace", cm("  namespace: b\n") + pod(ns, "    - configMapRef: {name: cfg}\n"), "", "", "cannot read the engine's port from --port $(PORT)"},
		{"a Secret after it", cm(ns) + pod(ns, "    - configMapRef: {name: cfg}\n    - secretRef: {name: s}\n"), "", "", "cannot read the engine's port from --port $(PORT)"},
		{"a Secret before it", cm(ns) + pod(ns, "    - secretRef: {name: s}\n    - configMapRef: {name: cfg}\n"), ":9000", "http://127.0.0.1:19000", ""},
		{"env after envFrom wins", cm(ns) + pod(ns, "    - configMapRef: {name: cfg}\n    env: [{name: PORT, value: \"9100\"}]\n"), ":9100", "http://127.0.0.1:19100", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := injectString(t, tc.in, Options{})
			if tc.refusal != "" {
				if err == nil || !strings.Contains(err.Error(), tc.refusal) {
					t.Fatalf("err = %v, want %q", err, tc.refusal)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var p corev1.Pod
			if err := sigsyaml.Unmarshal([]byte(out[strings.Index(out, "apiVersion: v1\nkind: Pod"):]), &p); err != nil {
				t.Fatal(err)
			}
			checkOutput(t, tc.in, out, Options{})
			env := sidecarEnv(p.Spec)
			if env["TIMING_SIDECAR_LISTEN"] != tc.listen || env["TIMING_SIDECAR_UPSTREAM"] != tc.upstream {
				t.Errorf("listen %q, upstream %q:\n%s", env["TIMING_SIDECAR_LISTEN"], env["TIMING_SIDECAR_UPSTREAM"], out)
			}
		})
	}
}
