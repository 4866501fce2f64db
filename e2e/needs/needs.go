// Package needs gives tests the programs they drive on a clean machine:
// Debian's programs (Prometheus, Python, Node, curl, Chromium), installed
// with apt-get when missing, and tools built from the Go module proxy (the
// OpenTelemetry Collector, Helm) into the user's cache. A test that cannot
// have one fails rather than passing by skipping what it claims to check.
// e2e/prepare gets them all ahead of the tests, saying what it does.
package needs

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Debian is every program the tests drive from Debian's packages, and
// the package that has it; gcc is the race detector's (-race needs cgo).
var Debian = []struct{ Program, Package string }{
	{"gcc", "gcc"}, {"prometheus", "prometheus"}, {"promtool", "prometheus"},
	{"python3", "python3"}, {"node", "nodejs"}, {"npm", "npm"}, {"curl", "curl"},
	{"chromium", "chromium"},
}

var mu sync.Mutex // one apt-get at a time

// Program makes sure program, one of Debian's, is on the PATH, installing
// its package when it is not, or fails the test.
func Program(t testing.TB, program string) {
	t.Helper()
	i := slices.IndexFunc(Debian, func(d struct{ Program, Package string }) bool { return d.Program == program })
	if i < 0 {
		t.Fatalf("needs: %s is not among the Debian programs the tests drive (needs.Debian)", program)
	}
	if err := Install(program, Debian[i].Package); err != nil {
		t.Fatal(err)
	}
}

// Install makes sure program is on the PATH, installing debianPackage
// with apt-get (as root, or with sudo -n) when it is not, and saying so on
// standard error.
func Install(program, debianPackage string) error {
	if _, err := exec.LookPath(program); err == nil {
		return nil
	}
	mu.Lock()
	defer mu.Unlock()
	if _, err := exec.LookPath(program); err == nil {
		return nil
	}
	if err := aptInstall(debianPackage); err != nil {
		return fmt.Errorf("%s is needed and could not be installed: %w", program, err)
	}
	if _, err := exec.LookPath(program); err != nil {
		return fmt.Errorf("%s is still missing after installing %s", program, debianPackage)
	}
	return nil
}

// InstallDebian installs, in one apt-get run, the packages of every
// program in Debian that is not on the PATH.
func InstallDebian() error {
	mu.Lock()
	defer mu.Unlock()
	var missing []string
	for _, d := range Debian {
		if _, err := exec.LookPath(d.Program); err != nil && !slices.Contains(missing, d.Package) {
			missing = append(missing, d.Package)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return aptInstall(missing...)
}

// aptInstall installs packages with apt-get, saying so on standard error.
func aptInstall(packages ...string) error {
	start := time.Now()
	fmt.Fprintf(os.Stderr, "needs: installing %s with apt-get\n", strings.Join(packages, " "))
	sudo := []string{}
	if os.Getuid() != 0 {
		sudo = []string{"sudo", "-n"}
	}
	for _, args := range [][]string{{"apt-get", "update", "-qq"}, append([]string{"apt-get", "install", "-y", "-qq"}, packages...)} {
		argv := append(append([]string{}, sudo...), args...)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %v\n%s", args, err, out)
		}
	}
	fmt.Fprintf(os.Stderr, "needs: installed in %s\n", time.Since(start).Round(time.Second))
	return nil
}
