package e2e

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/fzipp/gocyclo"
)

// maxComplexity is the most cyclomatic complexity a function outside the
// tests may have: past it, a function decides too many things at once.
const maxComplexity = 20

// TestFunctionsStaySimple holds every function outside the tests to
// maxComplexity, as gocyclo counts it.
func TestFunctionsStaySimple(t *testing.T) {
	stats := gocyclo.Analyze([]string{".."}, regexp.MustCompile(`(_test\.go|/testdata/|/node_modules/)`))
	for _, s := range stats.SortAndFilter(-1, maxComplexity) {
		t.Errorf("%s: %s has cyclomatic complexity %d, over %d: split it along what it decides", s.Pos, s.FuncName, s.Complexity, maxComplexity)
	}
}

// TestDeployKnowsPodsNotTheRequestPath: what writes manifests (deploy/)
// imports nothing of the request's path (proxy/); a default both need
// lives where both may import it.
func TestDeployKnowsPodsNotTheRequestPath(t *testing.T) {
	const proxyPkg = "github.com/timing-sidecar/timing-sidecar/proxy"
	err := filepath.WalkDir("../deploy", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == proxyPkg || strings.HasPrefix(p, proxyPkg+"/") {
				t.Errorf("%s imports %s", path, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
