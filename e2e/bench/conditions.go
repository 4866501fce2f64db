package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
)

// Conditions under which the sidecar's process is measured.
const (
	ConditionIdle  = "idle"  // the machine as it is
	ConditionBusy  = "busy"  // two CPU-bound loops beside it
	ConditionQuota = "quota" // the sidecar held to a share of a CPU by a CFS quota
)

// ConditionsOptions is an accuracy run with the sidecar as its own process
// (the release binary), once per condition and per mark clock: the
// kernel's receive time, and the clock at the read (the sidecar with
// --kernel-timestamps=false) for comparison.
type ConditionsOptions struct {
	Binary      string   // the timing-sidecar binary
	Conditions  []string // of ConditionIdle, ConditionBusy, ConditionQuota
	Quota       float64  // the CPU share under ConditionQuota, e.g. 0.1
	Requests    int      // streams per run
	Concurrency int
	Timing      emulator.Timing
	// Syscalls counts, with strace, the engine-side read system calls per
	// streamed event, in an extra short run per clock on the idle machine.
	Syscalls bool
	Progress io.Writer
}

// ConditionResult is one run: the metrics' errors against the engine's
// record, and the sidecar's own relay delay from its histogram.
type ConditionResult struct {
	Condition string       `json:"condition"`
	Clock     string       `json:"clock"`
	Skipped   string       `json:"skipped,omitempty"`
	Failed    int          `json:"failed"`
	Metrics   []ErrorStats `json:"metrics,omitempty"`
	// RelayP50 and RelayP99 are quantiles of
	// timing_sidecar_relay_delay_seconds in ms, interpolated in its
	// buckets as Prometheus's histogram_quantile does.
	RelayP50 float64 `json:"relay_delay_p50_ms"`
	RelayP99 float64 `json:"relay_delay_p99_ms"`
	// CPUSeconds is the sidecar's CPU time over the run.
	CPUSeconds float64 `json:"cpu_seconds"`
}

// SyscallResult is the engine-side reads of a short run under strace.
type SyscallResult struct {
	Clock         string  `json:"clock"`
	Skipped       string  `json:"skipped,omitempty"`
	Events        int     `json:"events"`
	Reads         int     `json:"reads"`  // read system calls on engine connections, EAGAIN included
	EAGAIN        int     `json:"eagain"` // of which returned nothing
	ReadsPerEvent float64 `json:"reads_per_event"`
}

// ConditionsResult is every run.
type ConditionsResult struct {
	Timing      string            `json:"timing"`
	Requests    int               `json:"requests"`
	Concurrency int               `json:"concurrency"`
	Quota       float64           `json:"quota"`
	Runs        []ConditionResult `json:"runs"`
	Syscalls    []SyscallResult   `json:"syscalls,omitempty"`
}

// clocks are the two ways the sidecar can take its marks.
var clocks = []struct{ name, flag string }{
	{"clock at the read", "--kernel-timestamps=false"},
	{"kernel receive time", "--kernel-timestamps=true"},
}

// Conditions runs the accuracy measurement against the sidecar's process
// under each condition, with each clock.
func Conditions(ctx context.Context, opts ConditionsOptions) (ConditionsResult, error) {
	t := opts.Timing
	res := ConditionsResult{Requests: opts.Requests, Concurrency: opts.Concurrency, Quota: opts.Quota,
		Timing: fmt.Sprintf("queue %v, ttft %v, itl %v, %d tokens, %d per event", t.HeaderDelay, t.TTFT, t.ITL, t.OutputTokens, max(t.TokensPerEvent, 1))}
	if opts.Requests < 1 || opts.Concurrency < 1 || opts.Timing.OutputTokens < 2 {
		return res, errors.New("accuracy: requests and concurrency must be positive, tokens at least 2")
	}
	opts.Timing.TokensPerEvent = max(opts.Timing.TokensPerEvent, 1)
	engine := emulator.New(emulator.Config{Timing: opts.Timing})
	if err := engine.Start("127.0.0.1:0"); err != nil {
		return res, err
	}
	defer engine.Close()
	for _, cond := range opts.Conditions {
		for _, clock := range clocks {
			note(opts.Progress, "%s, %s: %d streams, %d at a time", cond, clock.name, opts.Requests, opts.Concurrency)
			r, err := runCondition(ctx, opts, engine, cond, clock.flag)
			if err != nil {
				return res, fmt.Errorf("%s, %s: %w", cond, clock.name, err)
			}
			r.Condition, r.Clock = cond, clock.name
			res.Runs = append(res.Runs, r)
		}
	}
	if opts.Syscalls {
		for _, clock := range clocks {
			note(opts.Progress, "system calls, %s", clock.name)
			s, err := countReads(ctx, opts, engine, clock.flag)
			if err != nil {
				return res, fmt.Errorf("system calls, %s: %w", clock.name, err)
			}
			s.Clock = clock.name
			res.Syscalls = append(res.Syscalls, s)
		}
	}
	return res, nil
}

func note(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}

// runCondition starts the sidecar, puts it under cond, measures and stops it.
func runCondition(ctx context.Context, opts ConditionsOptions, engine *emulator.Server, cond, clockFlag string) (ConditionResult, error) {
	var r ConditionResult
	sc, err := startSidecarProcess(ctx, opts.Binary, engine.URL(), clockFlag)
	if err != nil {
		return r, err
	}
	defer sc.stop()
	switch cond {
	case ConditionIdle:
	case ConditionBusy:
		stopLoops, err := busyLoops(2)
		if err != nil {
			return r, err
		}
		defer stopLoops()
	case ConditionQuota:
		release, err := cpuQuota(sc.cmd.Process.Pid, opts.Quota)
		if err != nil {
			r.Skipped = err.Error()
			return r, nil
		}
		defer release()
	default:
		return r, fmt.Errorf("unknown condition %q (idle, busy or quota)", cond)
	}
	cpu0 := processCPU(sc.cmd.Process.Pid)
	errs, failed, err := measureStreams(ctx, sc.base, engine, AccuracyOptions{Requests: opts.Requests, Concurrency: opts.Concurrency, Timing: opts.Timing})
	if err != nil {
		return r, err
	}
	r.CPUSeconds = processCPU(sc.cmd.Process.Pid) - cpu0
	r.Failed = failed
	for i, tr := range truths {
		r.Metrics = append(r.Metrics, errorStats(tr, errs[i]))
	}
	r.RelayP50, r.RelayP99, err = sc.relayDelay(ctx)
	return r, err
}

// sidecarProcess is the release binary in front of the engine.
type sidecarProcess struct {
	cmd         *exec.Cmd
	base, admin string
}

// startSidecarProcess starts the sidecar on free loopback ports and waits
// until it answers /healthz.
func startSidecarProcess(ctx context.Context, binary, upstream, clockFlag string) (*sidecarProcess, error) {
	listen, err := freeAddr()
	if err != nil {
		return nil, err
	}
	admin, err := freeAddr()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, "--upstream", upstream, "--listen", listen, "--admin-listen", admin,
		"--access-log=false", "--log-level", "warn", clockFlag)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	sc := &sidecarProcess{cmd: cmd, base: "http://" + listen, admin: "http://" + admin}
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, err := http.Get(sc.admin + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return sc, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			sc.stop()
			return nil, fmt.Errorf("the sidecar did not come up: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (sc *sidecarProcess) stop() {
	sc.cmd.Process.Signal(syscall.SIGKILL) //nolint:errcheck
	sc.cmd.Wait()                          //nolint:errcheck
}

// relayDelay reads the median and p99 of the relay delay, in ms, from the
// sidecar's histogram.
func (sc *sidecarProcess) relayDelay(ctx context.Context) (p50, p99 float64, err error) {
	req, _ := http.NewRequestWithContext(ctx, "GET", sc.admin+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, 0, err
	}
	mf, ok := families["timing_sidecar_relay_delay_seconds"]
	if !ok || len(mf.GetMetric()) == 0 {
		return 0, 0, errors.New("no relay delay histogram")
	}
	h := mf.GetMetric()[0].GetHistogram()
	var bounds, counts []float64
	for _, b := range h.GetBucket() {
		bounds = append(bounds, b.GetUpperBound())
		counts = append(counts, float64(b.GetCumulativeCount()))
	}
	total := float64(h.GetSampleCount())
	return 1000 * bucketQuantile(0.5, bounds, counts, total), 1000 * bucketQuantile(0.99, bounds, counts, total), nil
}

// bucketQuantile interpolates quantile q linearly within the bucket that
// holds it, as PromQL's histogram_quantile does; past the last finite
// bound it is that bound.
func bucketQuantile(q float64, bounds, cumulative []float64, total float64) float64 {
	if total == 0 {
		return math.NaN()
	}
	rank := q * total
	lower, below := 0.0, 0.0
	for i, c := range cumulative {
		if c >= rank {
			if math.IsInf(bounds[i], 1) {
				return lower
			}
			if c == below {
				return bounds[i]
			}
			return lower + (bounds[i]-lower)*(rank-below)/(c-below)
		}
		lower, below = bounds[i], c
	}
	return bounds[len(bounds)-1]
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// busyLoops starts n CPU-bound processes and returns what stops them.
func busyLoops(n int) (func(), error) {
	var loops []*exec.Cmd
	stop := func() {
		for _, c := range loops {
			c.Process.Kill() //nolint:errcheck
			c.Wait()         //nolint:errcheck
		}
	}
	for range n {
		c := exec.Command("sh", "-c", "while :; do :; done")
		if err := c.Start(); err != nil {
			stop()
			return nil, err
		}
		loops = append(loops, c)
	}
	return stop, nil
}

// cpuQuota holds process pid to share of one CPU with a CFS quota in a new
// cgroup, v2's cpu.max or v1's cpu.cfs_quota_us, whichever this machine
// can make, and returns what removes it. It fails, saying why, where
// neither can be made (no cgroup CPU controller, or no permission).
func cpuQuota(pid int, share float64) (func(), error) {
	const period = 100000 // µs, the kernel's default CFS period
	quota := int(share * period)
	name := fmt.Sprintf("timing-sidecar-accuracy-%d", os.Getpid())
	type layout struct{ root, limitFile, limit, procs string }
	var tried []string
	for _, l := range []layout{
		{"/sys/fs/cgroup", "cpu.max", fmt.Sprintf("%d %d", quota, period), "cgroup.procs"},
		{"/sys/fs/cgroup/unified", "cpu.max", fmt.Sprintf("%d %d", quota, period), "cgroup.procs"},
		{"/sys/fs/cgroup/cpu", "cpu.cfs_quota_us", strconv.Itoa(quota), "cgroup.procs"},
		{"/sys/fs/cgroup/cpu,cpuacct", "cpu.cfs_quota_us", strconv.Itoa(quota), "cgroup.procs"},
	} {
		dir := filepath.Join(l.root, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			tried = append(tried, fmt.Sprintf("%s: %v", l.root, err))
			continue
		}
		// A cgroup's files appear with it; a plain directory (the tmpfs
		// that holds v1's hierarchies), or a v2 group without the cpu
		// controller, has no limit file.
		if _, err := os.Stat(filepath.Join(dir, l.limitFile)); err != nil {
			os.Remove(dir) //nolint:errcheck
			tried = append(tried, fmt.Sprintf("%s: no %s", l.root, l.limitFile))
			continue
		}
		remove := func() {
			// Back to the root before the group can go.
			os.WriteFile(filepath.Join(l.root, l.procs), []byte(strconv.Itoa(pid)), 0o644) //nolint:errcheck
			os.Remove(dir)                                                                 //nolint:errcheck
		}
		if l.limitFile == "cpu.cfs_quota_us" {
			os.WriteFile(filepath.Join(dir, "cpu.cfs_period_us"), []byte(strconv.Itoa(period)), 0o644) //nolint:errcheck
		}
		if err := os.WriteFile(filepath.Join(dir, l.limitFile), []byte(l.limit), 0o644); err != nil {
			remove()
			tried = append(tried, fmt.Sprintf("%s: %v", dir, err))
			continue
		}
		// Every thread of the process: cgroup.procs moves them all.
		if err := os.WriteFile(filepath.Join(dir, l.procs), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			remove()
			tried = append(tried, fmt.Sprintf("%s: %v", dir, err))
			continue
		}
		return remove, nil
	}
	return nil, fmt.Errorf("no CPU quota could be set on this machine (%s)", strings.Join(tried, "; "))
}

// processCPU is a process's CPU time in seconds, from its threads'
// scheduler counts (nanoseconds), or 0 where /proc does not have them.
func processCPU(pid int) float64 {
	dirs, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var ns float64
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err != nil {
			continue
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			v, _ := strconv.ParseFloat(f[0], 64)
			ns += v
		}
	}
	return ns / 1e9
}

// countReads runs a short load against a sidecar traced by strace and counts
// the read system calls on its engine connections per event they carried.
func countReads(ctx context.Context, opts ConditionsOptions, engine *emulator.Server, clockFlag string) (SyscallResult, error) {
	var s SyscallResult
	if _, err := exec.LookPath("strace"); err != nil {
		s.Skipped = "strace is not installed (apt-get install strace)"
		return s, nil
	}
	sc, err := startSidecarProcess(ctx, opts.Binary, engine.URL(), clockFlag)
	if err != nil {
		return s, err
	}
	defer sc.stop()
	dir, err := os.MkdirTemp("", "timing-sidecar-strace")
	if err != nil {
		return s, err
	}
	defer os.RemoveAll(dir)
	trace := exec.Command("strace", "-ff", "-qq", "-s", "65536", "-e", "trace=read,recvmsg,recvfrom",
		"-o", filepath.Join(dir, "t"), "-p", strconv.Itoa(sc.cmd.Process.Pid))
	if err := trace.Start(); err != nil {
		return s, err
	}
	// strace opens a file per thread as it attaches to it: the load
	// starts once it has them all.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		files, _ := filepath.Glob(filepath.Join(dir, "t.*"))
		threads, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", sc.cmd.Process.Pid))
		if len(threads) > 0 && len(files) >= len(threads) {
			break
		}
		if time.Now().After(deadline) {
			trace.Process.Kill() //nolint:errcheck
			trace.Wait()         //nolint:errcheck
			return s, errors.New("strace did not attach to the sidecar (ptrace not permitted?)")
		}
	}
	_, failed, err := measureStreams(ctx, sc.base, engine, AccuracyOptions{Requests: max(opts.Requests/4, 20), Concurrency: opts.Concurrency, Timing: opts.Timing})
	trace.Process.Signal(os.Interrupt) //nolint:errcheck
	trace.Wait()                       //nolint:errcheck
	if err != nil {
		return s, err
	}
	if failed > 0 {
		return s, fmt.Errorf("%d streams failed under strace", failed)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "t.*"))
	return parseReads(files)
}

// readCall matches a read-family call: its fd, and the rest of the line.
var readCall = regexp.MustCompile(`^(?:read|recvmsg|recvfrom)\((\d+), (.*)$`)

// parseReads counts read calls per connection in strace's per-thread files:
// a connection whose data holds the engine's response (a status line or an
// event) is an engine connection, and its every read, EAGAIN included,
// counts; events are counted by their "data:" lines.
func parseReads(files []string) (SyscallResult, error) {
	type call struct {
		fd     string
		eagain bool
		events int
	}
	var calls []call
	engineFDs := map[string]bool{}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return SyscallResult{}, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<22)
		for sc.Scan() {
			m := readCall.FindStringSubmatch(sc.Text())
			if m == nil {
				continue
			}
			rest := m[2]
			c := call{fd: m[1], eagain: strings.Contains(rest, "EAGAIN"), events: strings.Count(rest, "data: ")}
			if strings.Contains(rest, `"HTTP/1.1 `) || c.events > 0 {
				engineFDs[c.fd] = true
			}
			calls = append(calls, c)
		}
		f.Close()
	}
	var s SyscallResult
	for _, c := range calls {
		if !engineFDs[c.fd] {
			continue
		}
		s.Reads++
		s.Events += c.events
		if c.eagain {
			s.EAGAIN++
		}
	}
	if s.Events == 0 {
		return s, errors.New("strace saw no engine events")
	}
	s.ReadsPerEvent = float64(s.Reads) / float64(s.Events)
	return s, nil
}

// WriteTable writes r as plain-text tables.
func (r ConditionsResult) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "sidecar accuracy, the sidecar as its own process: %d streams per run, %d at a time; engine pacing: %s\n",
		r.Requests, r.Concurrency, r.Timing)
	fmt.Fprintln(w, "|error| against the engine's record, p50 / p99 in ms; the relay delay from the sidecar's histogram")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "condition\tclock\tTTFT\tgeneration\tqueue\tmax ITL\te2e\trelay delay p50 / p99\tCPU s\tfailed")
	pick := func(rs []ErrorStats, metric string) string {
		for _, m := range rs {
			if m.Metric == metric {
				return fmt.Sprintf("%.3f / %.3f", m.AbsP50, m.AbsP99)
			}
		}
		return "-"
	}
	for _, run := range r.Runs {
		cond := run.Condition
		if cond == ConditionQuota {
			cond = fmt.Sprintf("quota %.0f%% of a CPU", 100*r.Quota)
		}
		if run.Skipped != "" {
			fmt.Fprintf(tw, "%s\t%s\tskipped: %s\n", cond, run.Clock, run.Skipped)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.3f / %.3f\t%.2f\t%d\n", cond, run.Clock,
			pick(run.Metrics, "time_to_first_token_ms"), pick(run.Metrics, "generation_time_ms"), pick(run.Metrics, "queue_time_ms"),
			pick(run.Metrics, "max_itl_ms"), pick(run.Metrics, "e2e_latency_ms"), run.RelayP50, run.RelayP99, run.CPUSeconds, run.Failed)
	}
	tw.Flush()
	if len(r.Syscalls) == 0 {
		return
	}
	fmt.Fprintln(w, "\nengine-side read system calls per streamed event (strace, idle machine)")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "clock\tevents\treads\tof which EAGAIN\treads per event")
	for _, s := range r.Syscalls {
		if s.Skipped != "" {
			fmt.Fprintf(tw, "%s\tskipped: %s\n", s.Clock, s.Skipped)
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.2f\n", s.Clock, s.Events, s.Reads, s.EAGAIN, s.ReadsPerEvent)
	}
	tw.Flush()
}

// WriteJSON writes r as one JSON object.
func (r ConditionsResult) WriteJSON(w io.Writer) error {
	return json.NewEncoder(w).Encode(r)
}
