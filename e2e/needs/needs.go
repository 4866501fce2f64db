// Package needs gives tests the programs they drive (Prometheus, Python,
// Node, curl) on a clean machine: a program that is missing is installed
// from Debian's packages, and a test that cannot have it fails rather
// than passing by skipping what it claims to check.
package needs

import (
	"os"
	"os/exec"
	"sync"
	"testing"
)

var mu sync.Mutex // one apt-get at a time

// Program makes sure program is on the PATH, installing debianPackage
// with apt-get (as root, or with sudo -n) when it is not.
func Program(t testing.TB, program, debianPackage string) {
	t.Helper()
	if _, err := exec.LookPath(program); err == nil {
		return
	}
	mu.Lock()
	defer mu.Unlock()
	if _, err := exec.LookPath(program); err == nil {
		return
	}
	sudo := []string{}
	if os.Getuid() != 0 {
		sudo = []string{"sudo", "-n"}
	}
	for _, args := range [][]string{{"apt-get", "update", "-qq"}, {"apt-get", "install", "-y", "-qq", debianPackage}} {
		argv := append(append([]string{}, sudo...), args...)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s is needed and could not be installed (%v): %v\n%s", program, args, err, out)
		}
	}
	if _, err := exec.LookPath(program); err != nil {
		t.Fatalf("%s is still missing after installing %s", program, debianPackage)
	}
}
