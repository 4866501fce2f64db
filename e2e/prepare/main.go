// Command prepare gets what the tests drive onto this machine before they
// run, saying what it does at each slow stage: the Debian programs
// (Prometheus, Python, Node, curl, Chromium) that are missing, and the
// tools built from the Go module proxy into the user's cache (the
// OpenTelemetry Collector, then Helm). On a machine that has them all it
// takes a moment. The tests get anything still missing themselves; this
// only moves the wait to where it is announced.
//
//	go run ./e2e/prepare
//	go run ./e2e/prepare -path otelcol   (builds one tool if needed, prints its path)
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/timing-sidecar/timing-sidecar/e2e/needs"
)

func main() {
	path := flag.String("path", "", "build only this tool (otelcol or helm) if needed, and print its path")
	flag.Parse()
	if *path != "" {
		for _, tool := range []*needs.Tool{needs.Collector, needs.Helm} {
			if tool.Name == *path {
				p, err := tool.Path()
				if err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(1)
				}
				fmt.Println(p)
				return
			}
		}
		fmt.Fprintf(os.Stderr, "no tool %q: otelcol or helm\n", *path)
		os.Exit(2)
	}
	start := time.Now()
	say := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "prepare [%s] "+format+"\n", append([]any{time.Since(start).Round(time.Second)}, args...)...)
	}
	say("Debian programs the tests drive")
	if err := needs.InstallDebian(); err != nil {
		// The checks and the tests that need none of them still run; those
		// that do fail and say what is missing.
		say("could not install them, going on: %v", err)
	}
	// One after the other: each build uses every core, and the second
	// reuses the first's standard library and shared packages.
	for _, tool := range []*needs.Tool{needs.Collector, needs.Helm} {
		say("%s %s", tool.Name, tool.Version)
		if _, err := tool.Path(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	say("ready; next: gofmt, go vet and staticcheck compile every package (on a cold build cache, minutes without output), then the tests print each package as it passes")
}
