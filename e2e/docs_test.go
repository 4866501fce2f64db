package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The docs are reference: kept small enough to read, and every link in
// them leads somewhere.

// maxDocsBytes bounds all the repository's Markdown together.
const maxDocsBytes = 120_000

// markdownFiles is the repository's tracked Markdown, by path from the
// repository's root.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("git", "-C", "..", "ls-files", "*.md").Output()
	if err != nil {
		t.Skipf("git ls-files: %v", err) // not a clone: nothing to check
	}
	var files []string
	for _, f := range strings.Fields(string(out)) {
		if !strings.Contains(f, "node_modules/") {
			files = append(files, f)
		}
	}
	return files
}

func TestDocsStayReadable(t *testing.T) {
	total := 0
	for _, f := range markdownFiles(t) {
		b, err := os.ReadFile(filepath.Join("..", f))
		if err != nil {
			t.Fatal(err)
		}
		total += len(b)
		if f == "README.md" && len(b) > 20<<10 {
			t.Errorf("README.md is %d bytes: the newcomer's guide stays under 20 KiB", len(b))
		}
	}
	if total > maxDocsBytes {
		t.Errorf("the Markdown is %d bytes in all, over %d: say it once, where it lives", total, maxDocsBytes)
	}
}

var (
	mdLink  = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *$`)
	fence   = regexp.MustCompile("(?ms)^ *```.*?^ *```")
)

// slug is the anchor GitHub gives a heading.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestDocsLinksResolve: every relative link in the Markdown names a file
// or directory that exists, and an anchor a heading of that file makes.
func TestDocsLinksResolve(t *testing.T) {
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		a := map[string]bool{}
		if b, err := os.ReadFile(path); err == nil {
			for _, m := range heading.FindAllStringSubmatch(fence.ReplaceAllString(string(b), ""), -1) {
				a[slug(m[1])] = true
			}
		}
		anchors[path] = a
		return a
	}
	for _, f := range markdownFiles(t) {
		path := filepath.Join("..", f)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mdLink.FindAllStringSubmatch(fence.ReplaceAllString(string(b), ""), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			dest := path
			if file != "" {
				dest = filepath.Join(filepath.Dir(path), file)
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s links %s, which does not exist", f, target)
					continue
				}
			}
			if anchor != "" && !anchorsOf(dest)[anchor] {
				t.Errorf("%s links %s: no such heading in %s", f, target, filepath.Clean(dest))
			}
		}
	}
}
