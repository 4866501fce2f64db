package inject

import (
	"strings"
	"testing"

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
