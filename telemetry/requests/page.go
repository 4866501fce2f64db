package requests

import (
	"encoding/json"
	"html"
)

// Render is the page as HTML: for now the JSON, readable; the timeline
// view replaces it.
func Render(p *Page) []byte {
	b, _ := json.MarshalIndent(p, "", "  ")
	return []byte("<!doctype html><title>timing-sidecar: requests</title><pre>" + html.EscapeString(string(b)) + "</pre>")
}
