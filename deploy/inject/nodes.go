package inject

import (
	"fmt"
	"strconv"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// scalar is the value of the scalar at path in n, "" if there is none.
func scalar(n *yaml.RNode, path ...string) string {
	v, err := n.Pipe(yaml.Lookup(path...))
	if err != nil || v == nil || v.YNode().Kind != yaml.ScalarNode {
		return ""
	}
	return v.YNode().Value
}

// setInt sets field to the integer n, plain whatever the value before
// was: a port written "http" or in JSON's quotes becomes 18000, not
// "18000", which the API server would take for a name.
func setInt(n *yaml.RNode, field string, v int) error {
	return n.PipeE(yaml.FieldSetter{Name: field, Value: intNode(v), OverrideStyle: true})
}

// intNode is an integer scalar.
func intNode(n int) *yaml.RNode {
	return yaml.NewRNode(&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(n)})
}

// quoted is a double-quoted string scalar: a value that stays a string
// ("8000", "false").
func quoted(s string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s, Style: yaml.DoubleQuotedStyle}
}

// sequenceField is n's list field, made where it is missing or null.
func sequenceField(n *yaml.RNode, field string) (*yaml.RNode, error) {
	f := n.Field(field)
	if f != nil && !yaml.IsMissingOrNull(f.Value) {
		if f.Value.YNode().Kind != yaml.SequenceNode {
			return nil, fmt.Errorf("%s is not a list", field)
		}
		return f.Value, nil
	}
	if err := n.PipeE(yaml.FieldSetter{Name: field, Value: yaml.NewListRNode(), OverrideStyle: true}); err != nil {
		return nil, err
	}
	return n.Field(field).Value, nil
}

// isTrue tells a YAML 1.1 true, as kubectl reads one (true, yes, on, y).
func isTrue(v string) bool {
	switch strings.ToLower(v) {
	case "true", "yes", "on", "y":
		return true
	}
	return false
}

// stringsOf is the values of a list of strings, such as command.
func stringsOf(c *yaml.RNode, field string) []string {
	f := c.Field(field)
	if f == nil || f.Value.YNode().Kind != yaml.SequenceNode {
		return nil
	}
	var out []string
	for _, n := range f.Value.YNode().Content {
		out = append(out, n.Value)
	}
	return out
}
