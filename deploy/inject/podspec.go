package inject

import (
	"strings"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// podSpec is one pod spec in a document: where it is, for errors, and
// whether the sidecar can go in as a native sidecar.
type podSpec struct {
	node *yaml.RNode
	path string
	// native: the sidecar goes in as an init container with restartPolicy
	// Always (Kubernetes 1.29+), started before the engine and stopped
	// after it. KServe's runtimes take containers only, so there it is a
	// container beside the engine.
	native bool
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
}

// kserve kinds take the sidecar as a container.
var kserve = map[string]bool{"ServingRuntime": true, "ClusterServingRuntime": true, "InferenceService": true}

// podSpecsOf returns the pod specs of a document that has containers.
func podSpecsOf(doc *yaml.RNode) []podSpec {
	kind := doc.GetKind()
	var out []podSpec
	for _, path := range podSpecPaths[kind] {
		n, err := doc.Pipe(yaml.Lookup(path...))
		if err != nil || n == nil {
			continue
		}
		if c := n.Field("containers"); c == nil || c.Value.YNode().Kind != yaml.SequenceNode {
			continue
		}
		out = append(out, podSpec{node: n, path: strings.Join(path, "."), native: !kserve[kind]})
	}
	return out
}
