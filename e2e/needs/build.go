package needs

import (
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"time"
)

// Tool is a program the tests run that is built from the Go module proxy,
// by a module of its own under e2e/ (so its dependencies stay out of the
// product's go.mod), once per machine, into the user's cache directory.
//
// Tools build with the release binary's flags (.ci/build: no cgo,
// -trimpath), and their modules require the product's versions of the
// modules they share with it, so that the Go build cache compiles the
// standard library and those packages once for all three.
type Tool struct {
	Name, Version string
	module, pkg   string // the module's directory under e2e/, the package to build
	once          sync.Once
	path          string
	err           error
}

var (
	// Collector is an OpenTelemetry Collector with only the otlp
	// receiver and the file exporter (e2e/otelcol).
	Collector = &Tool{Name: "otelcol", Version: "v0.161.0", module: "otelcol", pkg: "."}
	// Helm is the Helm 4 CLI (e2e/helm).
	Helm = &Tool{Name: "helm", Version: "v4.3.2", module: "helm", pkg: "helm.sh/helm/v4/cmd/helm"}
)

// e2eDir is this source tree's e2e directory: the tools' modules are
// found beside this file, whatever directory the caller runs in.
func e2eDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// Path builds the tool unless the cache has it, and returns its path. A
// build says on standard error that it starts and how long it took.
func (b *Tool) Path() (string, error) {
	b.once.Do(func() {
		cache, err := os.UserCacheDir()
		if err != nil {
			cache = os.TempDir()
		}
		// Named for the module's go.sum too: a dependency bumped under the
		// same version builds anew.
		sum, err := os.ReadFile(filepath.Join(e2eDir(), b.module, "go.sum"))
		if err != nil {
			b.err = err
			return
		}
		dir := filepath.Join(cache, "timing-sidecar")
		path := filepath.Join(dir, fmt.Sprintf("%s-%s-%.6x-%s-%s", b.Name, b.Version, sha256.Sum256(sum), runtime.GOOS, runtime.GOARCH))
		if _, err := os.Stat(path); err == nil {
			b.path = path
			return
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.err = err
			return
		}
		start := time.Now()
		fmt.Fprintf(os.Stderr, "needs: building %s %s into %s (not in the cache yet)\n", b.Name, b.Version, dir)
		tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
		build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", tmp, b.pkg)
		build.Dir = filepath.Join(e2eDir(), b.module)
		build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=readonly", "GOWORK=off")
		if out, err := build.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("build %s %s: %v\n%s", b.Name, b.Version, err, out)
			return
		}
		// Renamed into place whole: a build cut short leaves no binary.
		if b.err = os.Rename(tmp, path); b.err == nil {
			b.path = path
			fmt.Fprintf(os.Stderr, "needs: %s %s built in %s\n", b.Name, b.Version, time.Since(start).Round(time.Second))
		}
	})
	return b.path, b.err
}
