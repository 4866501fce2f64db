package proxy

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// A sidecar beside a GPU engine shares a node of tens or hundreds of
// cores, often with a CPU request and no limit. Go would then run on
// every core: its scheduler spreads a few streams' work over idle Ps and
// spins looking for more, and the CPU per event rises (1.5 times with
// GOMAXPROCS=64 on two cores: e2e/bench/README.md).
// The sidecar sizes itself instead, as Istio sizes its Envoy to 2 worker
// threads.

// Where the sidecar's parallelism (GOMAXPROCS) came from, as the start
// log names it.
const (
	ParallelismEnv        = "GOMAXPROCS"  // the user's, as set
	ParallelismCPULimit   = "cpu_limit"   // the container's CPU limit (or CPU affinity), as Go reads it
	ParallelismCPURequest = "cpu_request" // --cpu-request: the container's request, rounded up to whole cores
	ParallelismDefault    = "default"     // DefaultParallelism
)

// DefaultParallelism is the sidecar's parallelism with neither a CPU
// limit nor a request to size it by: two cores relay 200 streams of 50
// events a second each in the comparison benchmark (e2e/bench/README.md),
// beside the engine's load generator, and a sidecar that needs more gets
// a request.
const DefaultParallelism = 2

// parallelism chooses the sidecar's GOMAXPROCS: the user's GOMAXPROCS
// (env, as set); else the figure Go took from the container's CPU limit
// (current below the machine's numCPU); else the CPU request in cores,
// rounded up; else DefaultParallelism. Never more than numCPU. A CPU
// limit at or above the machine's cores reads as none: the request or the
// default then applies, as a sidecar on such a node wants.
func parallelism(env string, current, numCPU int, request float64) (int, string) {
	switch {
	case env != "":
		return current, ParallelismEnv
	case current < numCPU:
		return current, ParallelismCPULimit
	case request > 0:
		return min(numCPU, max(1, int(math.Ceil(request-1e-9)))), ParallelismCPURequest
	}
	return min(numCPU, DefaultParallelism), ParallelismDefault
}

// sizeParallelism sets the process's GOMAXPROCS as parallelism chooses
// (request is a validated --cpu-request) and says what and why. Go's own
// figure (the user's, or the CPU limit's, which Go keeps following) is
// left alone.
func sizeParallelism(request string) (int, string) {
	cpu, _ := ParseCPU(request)
	n, source := parallelism(os.Getenv("GOMAXPROCS"), runtime.GOMAXPROCS(0), runtime.NumCPU(), cpu)
	if source == ParallelismCPURequest || source == ParallelismDefault {
		runtime.GOMAXPROCS(n)
	}
	return n, source
}

// ParseCPU reads a CPU quantity as Kubernetes writes one: cores ("2",
// "1.5") or millicores ("500m"). Empty is 0: none.
func ParseCPU(s string) (float64, error) {
	if s == "" {
		return 0, nil
	}
	scale := 1.0
	if v, ok := strings.CutSuffix(s, "m"); ok {
		s, scale = v, 1000
	}
	n, err := strconv.ParseFloat(s, 64)
	if err != nil || n < 0 || math.IsInf(n, 0) || math.IsNaN(n) {
		return 0, fmt.Errorf("CPU %q: want cores (2, 1.5) or millicores (500m)", s)
	}
	return n / scale, nil
}
