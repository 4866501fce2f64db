package inject

import (
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// podSpec is one pod spec in a document: where it is, for errors, and
// whose rules it obeys.
type podSpec struct {
	node *yaml.RNode
	path string
	// knative: the pod obeys Knative Serving's rules (KServe, whose
	// default mode is Knative, and Knative Services): one port in all,
	// no probes on a container without it, no downward API in env, no
	// init containers, so the sidecar is a container beside the engine.
	// Elsewhere it is a native sidecar: an init container with
	// restartPolicy Always (Kubernetes 1.29+), started before the engine
	// and stopped after it.
	knative bool
	// lwsRole is "leader" or "worker" in a LeaderWorkerSet's templates.
	lwsRole string
	// namespace is its document's, and configMaps the input's: where its
	// containers' envFrom is read from.
	namespace  string
	configMaps inputConfigMaps
}

// podSpecPaths is where each kind keeps its pod specs. Kinds not named
// here pass through untouched.
var podSpecPaths = map[string][][]string{
	"Pod":         {{"spec"}},
	"Deployment":  {{"spec", "template", "spec"}},
	"StatefulSet": {{"spec", "template", "spec"}},
	"DaemonSet":   {{"spec", "template", "spec"}},
	"ReplicaSet":  {{"spec", "template", "spec"}},
	"Job":         {{"spec", "template", "spec"}},
	"CronJob":     {{"spec", "jobTemplate", "spec", "template", "spec"}},
	// LeaderWorkerSet (multi-node serving): the leader runs the engine's
	// API server; workers usually run only ray, and are injected only if
	// they run an engine of their own.
	"LeaderWorkerSet": {
		{"spec", "leaderWorkerTemplate", "leaderTemplate", "spec"},
		{"spec", "leaderWorkerTemplate", "workerTemplate", "spec"},
	},
	// KServe: a runtime's containers are its spec's; an InferenceService's
	// predictor is a pod spec inline.
	"ServingRuntime":        {{"spec"}},
	"ClusterServingRuntime": {{"spec"}},
	"InferenceService":      {{"spec", "predictor"}},
	// KServe's LLMInferenceService (llm-d behind KServe) and its
	// configs: pod specs inline, rendered into Deployments and
	// LeaderWorkerSets.
	"LLMInferenceService":       llmInferenceServicePaths,
	"LLMInferenceServiceConfig": llmInferenceServicePaths,
	// A Knative Service (serving.knative.dev); Kubernetes' own Service
	// has no pod template, and passes.
	"Service": {{"spec", "template", "spec"}},
}

// kindGroups are the API groups of the kinds other projects also name
// (llmaz's Service, OME's ClusterServingRuntime): only these are read.
var kindGroups = map[string]string{
	"Service":                   "serving.knative.dev",
	"ServingRuntime":            "serving.kserve.io",
	"ClusterServingRuntime":     "serving.kserve.io",
	"InferenceService":          "serving.kserve.io",
	"LLMInferenceService":       "serving.kserve.io",
	"LLMInferenceServiceConfig": "serving.kserve.io",
}

var llmInferenceServicePaths = [][]string{{"spec", "template"}, {"spec", "worker"}, {"spec", "prefill", "template"}, {"spec", "prefill", "worker"}}

// kserve kinds take the sidecar as a container.
var kserve = map[string]bool{"ServingRuntime": true, "ClusterServingRuntime": true, "InferenceService": true}

// obeysKnative tells a document whose pods Knative Serving runs or may
// run: KServe's kinds (a ServingRuntime serves InferenceServices of
// either mode) and Knative's Service.
func obeysKnative(doc *yaml.RNode) bool {
	return kserve[doc.GetKind()] || strings.HasPrefix(doc.GetApiVersion(), "serving.knative.dev/")
}

// podSpecsOf returns the pod specs of a document that has containers,
// and of each item of a List (what kubectl get gives for several
// objects).
func podSpecsOf(doc *yaml.RNode) []podSpec {
	kind := doc.GetKind()
	var out []podSpec
	if kind == "List" {
		items, _ := doc.Pipe(yaml.Lookup("items"))
		if items == nil {
			return nil
		}
		elements, _ := items.Elements()
		for i, item := range elements {
			for _, ps := range podSpecsOf(item) {
				ps.path = fmt.Sprintf("items[%d] (%s %q) %s", i, item.GetKind(), item.GetName(), ps.path)
				out = append(out, ps)
			}
		}
		return out
	}
	if g, ok := kindGroups[kind]; ok && !strings.HasPrefix(doc.GetApiVersion(), g+"/") {
		return nil // another project's kind of the same name
	}
	for _, path := range podSpecPaths[kind] {
		n, err := doc.Pipe(yaml.Lookup(path...))
		if err != nil || n == nil {
			continue
		}
		if c := n.Field("containers"); c == nil || c.Value.YNode().Kind != yaml.SequenceNode {
			continue
		}
		ps := podSpec{node: n, path: strings.Join(path, "."), knative: obeysKnative(doc), namespace: doc.GetNamespace()}
		switch {
		case kind == "LeaderWorkerSet" && slices.Contains(path, "leaderTemplate"), strings.HasPrefix(kind, "LLMInferenceService") && !slices.Contains(path, "worker"):
			ps.lwsRole = "leader"
		case kind == "LeaderWorkerSet", strings.HasPrefix(kind, "LLMInferenceService"):
			ps.lwsRole = "worker"
		}
		out = append(out, ps)
	}
	return out
}
