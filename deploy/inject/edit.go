package inject

import (
	"sort"
	"strconv"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// An edit changes a scalar of the manifest: a word of a shell line, in
// place, or a whole command or args element.
type edit struct {
	node     *yaml.Node
	from, to int
	text     string
	whole    bool
	// appendArgs are words added to container's args.
	appendArgs []string
	container  *yaml.RNode
}

// setWord is the edit that makes word i of run say text.
func (run *invocation) setWord(i int, text string) edit {
	w := run.words[i]
	if w.inShell {
		return edit{node: w.node, from: w.from, to: w.to, text: text}
	}
	return edit{node: w.node, text: text, whole: true}
}

// apply makes the edits, those in one shell line from its end backwards
// so that each one's offsets still hold.
func apply(edits []edit) {
	sort.SliceStable(edits, func(i, j int) bool { return edits[i].from > edits[j].from })
	for _, e := range edits {
		if e.container != nil {
			args, err := sequenceField(e.container, "args")
			if err != nil {
				continue // refused before: engineIn checks args is a list
			}
			for _, a := range e.appendArgs {
				args.YNode().Content = append(args.YNode().Content, quoted(a))
			}
			continue
		}
		if e.whole {
			e.node.Value, e.node.Tag = e.text, "!!str"
			if _, err := strconv.Atoi(e.text); err == nil {
				// A number stays a string: command and args are strings.
				e.node.Style = yaml.DoubleQuotedStyle
			}
			continue
		}
		e.node.Value = e.node.Value[:e.from] + e.text + e.node.Value[e.to:]
	}
}
