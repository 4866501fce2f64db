package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
)

// cachedBuild is a tool the tests run, built from the Go module proxy by
// a module of its own under e2e/ (so its dependencies stay out of the
// product's go.mod), once per machine, into the user's cache directory.
type cachedBuild struct {
	name, version string
	module, pkg   string // the module's directory under e2e/, the package to build
	once          sync.Once
	path          string
	err           error
}

// get builds the tool unless the cache has it, and returns its path.
func (b *cachedBuild) get() (string, error) {
	b.once.Do(func() {
		cache, err := os.UserCacheDir()
		if err != nil {
			cache = os.TempDir()
		}
		dir := filepath.Join(cache, "timing-sidecar")
		path := filepath.Join(dir, fmt.Sprintf("%s-%s-%s-%s", b.name, b.version, runtime.GOOS, runtime.GOARCH))
		if _, err := os.Stat(path); err == nil {
			b.path = path
			return
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.err = err
			return
		}
		fmt.Fprintf(os.Stderr, "e2e: building %s %s into %s (first run on this machine; minutes)\n", b.name, b.version, dir)
		tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
		build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", tmp, b.pkg)
		build.Dir = b.module
		build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=readonly", "GOWORK=off")
		if out, err := build.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("build %s %s: %v\n%s", b.name, b.version, err, out)
			return
		}
		// Renamed into place whole: a build cut short leaves no binary.
		b.path, b.err = path, os.Rename(tmp, path)
	})
	return b.path, b.err
}
