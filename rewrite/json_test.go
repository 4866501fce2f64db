package rewrite

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// nestedObject is {"a":[[...]]}, an object nested depth deep.
func nestedObject(depth int) string {
	return `{"a":` + strings.Repeat("[", depth-1) + strings.Repeat("]", depth-1) + `}`
}

func TestValidWithin(t *testing.T) {
	tests := []struct {
		name, doc string
		want      bool
	}{
		{"at the limit", `[[1]]`, true},
		{"past the limit", `[[[1]]]`, false},
		{"objects count too", `{"a":{"b":[]}}`, false},
		{"brackets in a string", `{"a":"[[[{{{"}`, true},
		{"brackets in keys", `{"[[[[":{"]]]]":1}}`, true},
		{"escaped quote keeps the string open", `["\"[[[", "]]]"]`, true},
		{"escaped backslash closes the string", `["\\", [[1]]]`, false},
		{"escaped backslash then escaped quote", `["\\\"[[[", 1]`, true},
		{"two escaped backslashes", `["a\\\\", [1]]`, true},
		{"unicode escape", `["\u005b\u005b[[[", 1]`, true},
		{"closes before opens", `]]][[[`, false},
		{"unterminated string", `[["[[[[`, false},
		{"not JSON", `[[1]`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := validWithin(tt.doc, 2); got != tt.want {
				t.Fatalf("validWithin(%s, 2) = %v, want %v", tt.doc, got, tt.want)
			}
		})
	}
}

func TestValidMaxDepth(t *testing.T) {
	if !valid(nestedObject(maxDepth)) {
		t.Fatal("an object maxDepth deep is not valid")
	}
	if valid(nestedObject(maxDepth + 1)) {
		t.Fatal("an object deeper than maxDepth is valid")
	}
	// Thousands of brackets in strings, with escaped quotes among them:
	// past the quick count, so the exact scan runs, and finds depth 2.
	s := `{"code":"` + strings.Repeat(`[{\"k\": [1, \\\\]}, `, 2000) + `","b":[1]}`
	if !gjson.Valid(s) || !valid(s) {
		t.Fatal("brackets inside strings counted as nesting")
	}
}

func TestValidAllocatesNothing(t *testing.T) {
	s := `{"code":"` + strings.Repeat(`[{\"k\": [1]}, `, 2000) + `"}`
	if allocs := testing.AllocsPerRun(100, func() { valid(s) }); allocs != 0 {
		t.Fatalf("valid allocates %v times, want 0", allocs)
	}
}
