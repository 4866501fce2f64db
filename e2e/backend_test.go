package e2e

import (
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// startBackend runs an ecosystem server the tests check against (the
// OpenTelemetry Collector, Prometheus) for one test: it is killed at the
// end, its output is shown if the test failed, and startBackend returns
// once ready says so, or fails the test if the process exits or 30 s pass
// first.
func startBackend(t *testing.T, name string, cmd *exec.Cmd, ready func() bool) {
	t.Helper()
	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }() //nolint:errcheck
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("%s's log:\n%s", name, log.String())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for !ready() {
		select {
		case <-exited:
			t.Fatalf("%s exited:\n%s", name, log.String())
		case <-time.After(50 * time.Millisecond): // polling its ports, which have no event to await
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready within 30s:\n%s", name, log.String())
		}
	}
}

// listening tells whether every address accepts a TCP connection.
func listening(addrs ...string) bool {
	for _, addr := range addrs {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false
		}
		c.Close()
	}
	return true
}

// answers200 tells whether a GET of url answers 200.
func answers200(url string) bool {
	resp, err := http.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
