package inject

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// inject reads manifests its users did not write (a chart's output through
// a Helm post-renderer, a CI pipeline's input), so every input has a
// bound, checked before the work it bounds.
const (
	// maxInput bounds the manifests read, in bytes: several times the
	// largest rendered charts (kube-prometheus-stack with its CRDs is
	// under 4 MiB), and every object within the API server's 3 MiB.
	maxInput = 16 << 20
	// maxDocuments bounds the YAML documents in the input.
	maxDocuments = 10_000
	// aliasFloor and the document's own size bound the nodes its aliases
	// may add once expanded: an alias shares its anchor's nodes, and inject
	// gives each its own copy. A document may grow by aliasFloor nodes, or
	// double if it is larger: an anchor of 2,000 env entries may be aliased
	// by four containers, and a manifest at the bound is injected in about
	// 80 MB. A 600-byte document of anchors nested nine deep would expand
	// to 387 million nodes; Kubernetes bounded the same expansion after
	// CVE-2019-11253, and go-yaml v3 refuses "excessive aliasing" by a
	// like rule.
	aliasFloor = 50_000
	// maxArg is the longest string the kernel passes to a program as an
	// argument or an environment variable (Linux's MAX_ARG_STRLEN, 32
	// pages): a longer shell line or value could not start a container,
	// so inject reads none longer.
	maxArg = 128 << 10
	// maxExpanded bounds what the kubelet's $(VAR) expansion writes for
	// one container in all, its env and its command's words: the kernel
	// refuses a program arguments and environment past a quarter of the
	// stack limit (2 MiB by default), so a container's are within it.
	maxExpanded = 2 << 20
)

// errTooLarge is the refusal of input past maxInput.
var errTooLarge = fmt.Errorf("the manifests are over %d MiB: inject reads at most that much at once; split them", maxInput>>20)

// readBounded reads the manifests, refusing them past maxInput or
// maxDocuments.
func readBounded(in io.Reader) ([]byte, error) {
	src, err := io.ReadAll(io.LimitReader(in, maxInput+1))
	if err != nil {
		return nil, fmt.Errorf("read the manifests: %w", err)
	}
	if len(src) > maxInput {
		return nil, errTooLarge
	}
	return src, countDocuments(src)
}

// countDocuments refuses input with more than maxDocuments documents,
// before they are parsed: each costs a decoder of its own.
func countDocuments(src []byte) error {
	// A separator is a line that starts with "---", as the reader splits
	// documents; the count is at most one over theirs (a leading one).
	if n := bytes.Count(src, []byte("\n---")) + 1; n > maxDocuments+1 {
		return fmt.Errorf("the input has %d YAML documents: inject reads at most %d at once; split them", n, maxDocuments)
	}
	return nil
}

// errAliasCycle is the refusal of an anchor that contains an alias to
// itself: its expansion never ends.
var errAliasCycle = errors.New("an anchor contains an alias to itself")

// maxAliasedKeys bounds a mapping's keys in a document with aliases:
// kyaml's expansion (DeAnchor) merges every mapping in time that grows with
// the square of its keys.
const maxAliasedKeys = 10_000

// boundAliases refuses a document whose aliases, expanded, would add more
// nodes than its bound (aliasFloor), or never end, and tells whether the
// document has any to expand. It walks each node once: an anchor's
// expanded size is kept for its every alias.
func boundAliases(doc *yaml.Node) (aliased bool, err error) {
	var shape docShape
	shape.walk(doc)
	if !shape.aliased {
		return false, nil
	}
	if shape.maxKeys > maxAliasedKeys {
		return true, fmt.Errorf("a mapping of %d keys in a document with aliases: inject expands aliases only in documents whose mappings have at most %d", shape.maxKeys, maxAliasedKeys)
	}
	limit := shape.nodes + max(aliasFloor, shape.nodes)
	e := expansion{size: map[*yaml.Node]int{}, open: map[*yaml.Node]bool{}, limit: limit}
	n, err := e.count(doc)
	if err != nil {
		return true, err
	}
	if n > limit {
		return true, fmt.Errorf("its aliases expand it from %d YAML nodes to over %d: inject lets aliases add at most %d (an alias bomb?)", shape.nodes, limit, limit-shape.nodes)
	}
	return true, nil
}

// docShape is what a walk of a document as parsed finds: its nodes (an
// alias counted once), whether it has aliases or merge keys, and its
// largest mapping's keys.
type docShape struct {
	nodes, maxKeys int
	aliased        bool
}

func (s *docShape) walk(n *yaml.Node) {
	s.nodes++
	switch n.Kind {
	case yaml.AliasNode:
		s.aliased = true
	case yaml.MappingNode:
		s.maxKeys = max(s.maxKeys, len(n.Content)/2)
		for i := 0; i < len(n.Content); i += 2 {
			s.aliased = s.aliased || n.Content[i].Tag == "!!merge" || n.Content[i].Value == "<<"
		}
	}
	for _, c := range n.Content {
		s.walk(c)
	}
}

// expansion counts the nodes of a tree with its aliases expanded.
type expansion struct {
	size  map[*yaml.Node]int  // an anchor's expanded size, once known
	open  map[*yaml.Node]bool // the anchors on the walk's path
	limit int                 // a count past it is not finished
}

// count is the nodes n holds once its aliases are expanded, or at least
// limit+1 when that is more.
func (e *expansion) count(n *yaml.Node) (int, error) {
	if n.Kind == yaml.AliasNode {
		if n.Alias == nil {
			return 1, nil
		}
		n = n.Alias
	}
	if n.Anchor != "" {
		if e.open[n] {
			return 0, fmt.Errorf("%w (&%s)", errAliasCycle, n.Anchor)
		}
		if s, ok := e.size[n]; ok {
			return s, nil
		}
		e.open[n] = true
		defer delete(e.open, n)
	}
	total := 1
	for _, c := range n.Content {
		s, err := e.count(c)
		if err != nil {
			return 0, err
		}
		if total += s; total > e.limit {
			return total, nil
		}
	}
	if n.Anchor != "" {
		e.size[n] = total
	}
	return total, nil
}
