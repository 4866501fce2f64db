package inject

import (
	"fmt"
	"strconv"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// unreadFixes says, by kind ("group/Kind") or API group, why inject does
// not read a kind that holds containers, and what works instead. Kinds
// not named get genericFix, and are named only if an engine is among
// their containers.
var unreadFixes = map[string]string{
	// An OpenShift Template's objects are Deployments or runtimes with
	// ${PARAMETER}s still in them: processed, they are kinds inject reads.
	"template.openshift.io": "process it first (oc process -f FILE | timing-sidecar inject)",
	// KubeRay makes the head's Services from its containers' ports, and
	// AIBrix's RayClusterFleet makes RayClusters: a moved engine port
	// would be what they expose, not the sidecar's.
	"ray.io": "KubeRay makes Services from its containers' ports, which would then reach the engine's new port and not the sidecar: add the sidecar by hand",
	"orchestration.aibrix.ai/RayClusterFleet": "it makes RayClusters, and KubeRay makes Services from their containers' ports, which would then reach the engine's new port and not the sidecar: add the sidecar by hand",
	// Dynamo's workers run the engine in-process and answer its frontend
	// over Dynamo's own transport: no engine in its pods serves HTTP.
	"nvidia.com": "Dynamo's operator makes the pods from it, and its workers serve no HTTP API (its frontend routes to them over Dynamo's own transport): there is no engine HTTP server for the sidecar to stand in front of",
}

// genericFix is the advice for a kind inject does not read.
const genericFix = "its controller makes the pods from it, in a shape inject does not know: add the sidecar by hand"

// fixFor is the advice for a kind inject does not read, and whether the
// kind is one unreadFixes names.
func fixFor(apiVersion, kind string) (string, bool) {
	group, _, _ := strings.Cut(apiVersion, "/")
	if fix, ok := unreadFixes[group+"/"+kind]; ok {
		return fix, true
	}
	if fix, ok := unreadFixes[group]; ok {
		return fix, true
	}
	return genericFix, false
}

// unreadKinds refuses input where no engine was found in the kinds inject
// reads but one, or the container --engine-container names, is in a kind
// it does not read: the refusal names the kind, where the container is,
// and what to do.
func unreadKinds(docs []*yaml.RNode, opts *Options) error {
	for i, doc := range docs {
		if err := unreadKind(doc, opts); err != nil {
			return fmt.Errorf("document %d (%s %q): %w", i+1, doc.GetKind(), doc.GetName(), err)
		}
	}
	return nil
}

// unreadKind is the refusal of one document of a kind inject does not
// read, if one of its containers is an engine or the named container.
func unreadKind(doc *yaml.RNode, opts *Options) error {
	kind := doc.GetKind()
	if kind == "List" {
		items, _ := doc.Pipe(yaml.Lookup("items"))
		if items == nil {
			return nil
		}
		elements, _ := items.Elements()
		return unreadKinds(elements, opts)
	}
	if len(podSpecsOf(doc)) > 0 {
		return nil // read: its pod specs had no engine
	}
	fix, known := fixFor(doc.GetApiVersion(), kind)
	for _, at := range containerObjects(doc.YNode(), "") {
		rc := yaml.NewRNode(at.node)
		what := engineLike(rc)
		if opts.EngineContainer != "" && scalar(rc, "name") == opts.EngineContainer {
			what = "is the one --engine-container names"
		}
		if what == "" && !known {
			continue
		}
		which := "its container"
		if name := scalar(rc, "name"); name != "" {
			which += " " + strconv.Quote(name)
		}
		if what == "" {
			return fmt.Errorf("inject does not read %s (%s), which holds containers (the first at %s): %s", kind, doc.GetApiVersion(), at.path, fix)
		}
		return fmt.Errorf("inject does not read %s (%s): %s at %s %s; %s", kind, doc.GetApiVersion(), which, at.path, what, fix)
	}
	return nil
}

// containerAt is a container found in a document, and its path.
type containerAt struct {
	path string
	node *yaml.Node
}

// containerObjects finds the containers under n, path being n's: each
// item of a "containers" or "initContainers" list, and any other object
// with an image (OME's runner, Dynamo's mainContainer). A container's
// own fields are not searched.
func containerObjects(n *yaml.Node, path string) []containerAt {
	var out []containerAt
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			out = append(out, containerObjects(c, path)...)
		}
	case yaml.MappingNode:
		if isContainer(n) {
			return []containerAt{{path: strings.TrimSuffix(path, "."), node: n}}
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			out = append(out, containerObjects(n.Content[i+1], path+n.Content[i].Value+".")...)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			out = append(out, containerObjects(c, strings.TrimSuffix(path, ".")+"["+strconv.Itoa(i)+"].")...)
		}
	}
	return out
}

// isContainer tells a mapping that is a container: its image is a
// scalar.
func isContainer(n *yaml.Node) bool {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == "image" && n.Content[i+1].Kind == yaml.ScalarNode {
			return true
		}
	}
	return false
}

// engineLike says what makes c look like an engine ("runs vllm serve",
// "runs vLLM's image"), "" if nothing does.
func engineLike(c *yaml.RNode) string {
	if name := engineMention(c); name != "" {
		return "runs " + name
	}
	image := scalar(c, "image")
	for i := range engines {
		if image != "" && engines[i].imageIs(image) {
			return "runs " + engines[i].name + "'s image"
		}
	}
	return ""
}

// inputConfigMaps are the ConfigMaps in the input, by name: what a
// container's envFrom takes from one of them is known.
type inputConfigMaps map[string][]inputConfigMap

type inputConfigMap struct {
	namespace string
	data      map[string]string
}

// configMapsOf collects the input's ConfigMaps, List items included.
func configMapsOf(docs []*yaml.RNode) inputConfigMaps {
	maps := inputConfigMaps{}
	var add func(doc *yaml.RNode)
	add = func(doc *yaml.RNode) {
		switch doc.GetKind() {
		case "List":
			if items, _ := doc.Pipe(yaml.Lookup("items")); items != nil {
				elements, _ := items.Elements()
				for _, item := range elements {
					add(item)
				}
			}
		case "ConfigMap":
			if doc.GetApiVersion() != "v1" {
				return
			}
			data := map[string]string{}
			if d, _ := doc.Pipe(yaml.Lookup("data")); d != nil && d.YNode().Kind == yaml.MappingNode {
				// The pairs in one pass: a lookup per key is quadratic.
				c := d.YNode().Content
				for i := 0; i+1 < len(c); i += 2 {
					if c[i+1].Kind == yaml.ScalarNode {
						data[c[i].Value] = c[i+1].Value
					}
				}
			}
			maps[doc.GetName()] = append(maps[doc.GetName()], inputConfigMap{namespace: doc.GetNamespace(), data: data})
		}
	}
	for _, doc := range docs {
		add(doc)
	}
	return maps
}

// lookup is the data of the ConfigMap name in namespace, if the input has
// it: one in the same namespace, else one where either leaves it to
// kubectl's.
func (m inputConfigMaps) lookup(name, namespace string) (map[string]string, bool) {
	for _, exact := range []bool{true, false} {
		for _, cm := range m[name] {
			if cm.namespace == namespace || !exact && (cm.namespace == "" || namespace == "") {
				return cm.data, true
			}
		}
	}
	return nil, false
}
