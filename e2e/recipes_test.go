package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
	"github.com/timing-sidecar/timing-sidecar/e2e/needs"
)

// The README's client recipes are the programs in e2e/recipes, and this
// test is what keeps them working as written: it installs the exact
// package versions of e2e/recipes/package-lock.json, type-checks every
// program with `tsc --strict` under TypeScript 5.9 and 7 (a recipe a new
// user pastes into either must compile), runs each against the release
// binary in front of the emulated engine, and checks that the metrics
// object it printed is the one the sidecar adds. The README's code blocks
// must appear in the programs verbatim, so the two cannot drift apart.

// recipes are the programs and what each prints: one line per call,
// "label {metrics}", and whether that call streamed. langchain.ts also
// stops a stream mid-way, which must not end the process.
var recipes = []struct {
	file  string
	calls map[string]bool // label → streamed
}{
	{"openai-sdk.ts", map[string]bool{"stream": true, "create": false}},
	{"vercel-ai-sdk.ts", map[string]bool{"streamText": true, "generateText": false}},
	{"langchain.ts", map[string]bool{"stream": true, "invoke": false}},
}

// typeScripts are the compilers every recipe must pass, each run by a
// script of e2e/recipes/package.json (which installs 7 under an alias):
// 5.9's build also writes the JavaScript that runs.
var typeScripts = []struct{ version, script string }{
	{"7", "check-ts7"},
	{"5.9", "build"},
}

func TestClientRecipes(t *testing.T) {
	t.Parallel() // its own processes: beside the other long tests, not after them
	needs.Program(t, "node")
	needs.Program(t, "npm")
	requireNode(t, 20) // @langchain/core 1.4's floor; Debian 12's own nodejs is 18
	checkREADMERecipes(t)

	// A work directory with the programs, beside the cached install.
	work := t.TempDir()
	for _, f := range append([]string{"run.ts", "tsconfig.json", "package.json"}, recipeFiles()...) {
		copyFile(t, filepath.Join("recipes", f), filepath.Join(work, f))
	}
	modules := recipeModules(t)
	if err := os.Symlink(modules, filepath.Join(work, "node_modules")); err != nil {
		t.Fatal(err)
	}
	for _, ts := range typeScripts {
		tsc := exec.Command("npm", "run", "--silent", ts.script)
		tsc.Dir = work
		if out, err := tsc.CombinedOutput(); err != nil {
			t.Fatalf("TypeScript %s (tsc --strict) rejects the recipes: %v\n%s", ts.version, err, out)
		}
	}

	engine := startEngine(t, emulator.Config{Timing: emulator.DefaultTiming})
	s := startSidecar(t, []string{"--upstream", engine.URL()})
	for _, r := range recipes {
		t.Run(r.file, func(t *testing.T) {
			cmd := exec.Command("node", filepath.Join(work, "dist", strings.TrimSuffix(r.file, ".ts")+".js"))
			cmd.Env = append(os.Environ(), "SIDECAR_URL="+s.base)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", r.file, err, out, stderr.Bytes())
			}
			t.Logf("%s printed:\n%s", r.file, out)
			got := map[string]metrics{}
			for line := range strings.Lines(string(out)) {
				label, raw, _ := strings.Cut(strings.TrimSpace(line), " ")
				if _, ok := r.calls[label]; ok {
					got[label] = parseMetrics(t, raw)
				}
			}
			for label, streamed := range r.calls {
				m, ok := got[label]
				if !ok {
					t.Errorf("%s printed no metrics for %s:\n%s", r.file, label, out)
					continue
				}
				checkRecipeMetrics(t, label, streamed, m)
			}
		})
	}
}

// checkRecipeMetrics checks that m is the sidecar's object for one call
// to the engine of TestClientRecipes: its counts and latency always, the
// stream's fields on a stream (positive: that engine waits before the
// first token and between tokens) and null without one.
func checkRecipeMetrics(t *testing.T, label string, streamed bool, m metrics) {
	t.Helper()
	if v := m["completion_tokens"]; v == nil || *v != float64(emulator.DefaultTiming.OutputTokens) {
		t.Errorf("%s: completion_tokens is %s, want the engine's %d", label, show(v), emulator.DefaultTiming.OutputTokens)
	}
	for _, k := range []string{"e2e_latency_ms", "prompt_tokens", "tokens_per_second"} {
		if v := m[k]; v == nil || *v <= 0 {
			t.Errorf("%s: %s is %s, want a positive number", label, k, show(v))
		}
	}
	for _, k := range []string{"time_to_first_token_ms", "generation_time_ms", "mean_itl_ms", "max_itl_ms"} {
		v, ok := m[k]
		switch {
		case !ok:
			t.Errorf("%s: no %s", label, k)
		case streamed && (v == nil || *v <= 0):
			t.Errorf("%s: %s is %s on a stream, want a positive number", label, k, show(v))
		case !streamed && v != nil:
			t.Errorf("%s: %s is %s without a stream, want null", label, k, show(v))
		}
	}
}

func show(v *float64) string {
	if v == nil {
		return "null"
	}
	return strconv.FormatFloat(*v, 'f', -1, 64)
}

// recipeFiles are the programs, in the order of recipes.
func recipeFiles() []string {
	var files []string
	for _, r := range recipes {
		files = append(files, r.file)
	}
	return files
}

// requireNode fails unless node's major version is at least major.
func requireNode(t *testing.T, major int) {
	t.Helper()
	out, err := exec.Command("node", "--version").Output()
	if err != nil {
		t.Fatalf("node --version: %v", err)
	}
	v := strings.TrimPrefix(strings.TrimSpace(string(out)), "v")
	if got, err := strconv.Atoi(strings.Split(v, ".")[0]); err != nil || got < major {
		t.Fatalf("the recipes' packages need Node.js %d or later; this machine has %s", major, out)
	}
}

// recipeModules returns a node_modules installed by `npm ci` from
// e2e/recipes' lockfile, kept in the user cache directory under the
// lockfile's hash: the first run installs (about 15 s), later runs reuse
// it, and nothing is installed inside the repository, where gofmt and
// `go vet ./...` would walk it.
func recipeModules(t *testing.T) string {
	t.Helper()
	lock, err := os.ReadFile(filepath.Join("recipes", "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(lock) // it names every package and version
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	parent := filepath.Join(cache, "timing-sidecar")
	dir := filepath.Join(parent, "recipes-"+hex.EncodeToString(sum[:8]))
	modules := filepath.Join(dir, "node_modules")
	if _, err := os.Stat(modules); err == nil {
		return modules
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp(parent, "recipes-install-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp) // empty once renamed
	for _, f := range []string{"package.json", "package-lock.json"} {
		copyFile(t, filepath.Join("recipes", f), filepath.Join(tmp, f))
	}
	// --engine-strict: a package that needs a newer Node.js fails here,
	// not with a crash in the recipe.
	install := exec.Command("npm", "ci", "--engine-strict", "--no-audit", "--no-fund", "--loglevel=error")
	install.Dir = tmp
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in e2e/recipes: %v\n%s", err, out)
	}
	// Renamed into place whole: an install cut short leaves nothing to
	// reuse; a run that lost the race uses the winner's.
	if err := os.Rename(tmp, dir); err != nil {
		if _, statErr := os.Stat(modules); statErr != nil {
			t.Fatalf("keep the recipes' install: %v", err)
		}
	}
	return modules
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// readmeSection is the README's part on client recipes.
const readmeSection = "## Reading the metrics from your client"

// checkREADMERecipes checks that every TypeScript block in the README's
// client section is in one of the programs verbatim (indentation aside),
// and that the section links every program.
func checkREADMERecipes(t *testing.T) {
	t.Helper()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n"+readmeSection+"\n")
	if !ok {
		t.Fatalf("README.md has no %q", readmeSection)
	}
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	listed, err := filepath.Glob(filepath.Join("recipes", "*.ts"))
	if err != nil {
		t.Fatal(err)
	}
	if len(listed) != len(recipes)+1 { // the programs and run.ts
		t.Errorf("e2e/recipes has %v: list every program but run.ts in recipes, so that it runs", listed)
	}
	var programs []string
	for _, f := range recipeFiles() {
		b, err := os.ReadFile(filepath.Join("recipes", f))
		if err != nil {
			t.Fatal(err)
		}
		programs = append(programs, string(b))
		if !strings.Contains(section, "(e2e/recipes/"+f+")") {
			t.Errorf("README's %q does not link e2e/recipes/%s", readmeSection, f)
		}
	}
	blocks := tsBlock.FindAllStringSubmatch(section, -1)
	if len(blocks) == 0 {
		t.Fatalf("README's %q has no ts block", readmeSection)
	}
	for _, b := range blocks {
		code := dedent(b[1], b[2])
		found := false
		for _, p := range programs {
			found = found || strings.Contains(p, code)
		}
		if !found {
			t.Errorf("this README block is in no program in e2e/recipes; copy it from there:\n%s", code)
		}
	}
}

// tsBlock matches a fenced ts block, capturing its fence's indentation and
// its code.
var tsBlock = regexp.MustCompile("(?m)^([ \t]*)```ts\n((?s:.*?))^[ \t]*```$")

// dedent removes indent from the start of every line of code.
func dedent(indent, code string) string {
	var b strings.Builder
	for line := range strings.Lines(code) {
		b.WriteString(strings.TrimPrefix(line, indent))
	}
	return b.String()
}
