package inject

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// isJSON tells input that is JSON (kubectl get -o json): it comes back as
// JSON.
func isJSON(src []byte) bool {
	trimmed := bytes.TrimLeft(src, " \t\r\n")
	return len(trimmed) > 0 && trimmed[0] == '{'
}

// writeJSON writes each YAML document of y as JSON, keys in their order,
// indented as kubectl indents.
func writeJSON(out io.Writer, y []byte) error {
	dec := yaml.NewDecoder(bytes.NewReader(y))
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("write JSON: %w", err)
		}
		var compact bytes.Buffer
		if err := appendJSON(&compact, &doc); err != nil {
			return fmt.Errorf("write JSON: %w", err)
		}
		var indented bytes.Buffer
		if err := json.Indent(&indented, compact.Bytes(), "", "    "); err != nil {
			return fmt.Errorf("write JSON: %w", err)
		}
		indented.WriteByte('\n')
		if _, err := out.Write(indented.Bytes()); err != nil {
			return err
		}
	}
}

// appendJSON writes n as JSON: mappings in their order, scalars by their
// resolved tag.
func appendJSON(b *bytes.Buffer, n *yaml.Node) error {
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			b.WriteString("null")
			return nil
		}
		return appendJSON(b, n.Content[0])
	case yaml.AliasNode:
		return appendJSON(b, n.Alias)
	case yaml.MappingNode:
		b.WriteByte('{')
		for i := 0; i+1 < len(n.Content); i += 2 {
			if i > 0 {
				b.WriteByte(',')
			}
			writeString(b, n.Content[i].Value)
			b.WriteByte(':')
			if err := appendJSON(b, n.Content[i+1]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case yaml.SequenceNode:
		b.WriteByte('[')
		for i, item := range n.Content {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := appendJSON(b, item); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			b.WriteString("null")
		case "!!bool":
			v, err := strconv.ParseBool(n.Value)
			if err != nil {
				return err
			}
			b.WriteString(strconv.FormatBool(v))
		case "!!int", "!!float":
			if !json.Valid([]byte(n.Value)) {
				return fmt.Errorf("%q is not a JSON number", n.Value)
			}
			b.WriteString(n.Value)
		default:
			writeString(b, n.Value)
		}
	}
	return nil
}

// writeString writes s as a JSON string, & < > as themselves: shell
// lines keep their && readable.
func writeString(b *bytes.Buffer, s string) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	enc.Encode(s)           //nolint:errcheck // a string always encodes
	b.Truncate(b.Len() - 1) // Encode's newline
}
