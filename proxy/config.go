package proxy

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/timing-sidecar/timing-sidecar/proxy/tlsserve"

	"github.com/timing-sidecar/timing-sidecar/proxy/upstream"
	"github.com/timing-sidecar/timing-sidecar/rewrite"
	"github.com/timing-sidecar/timing-sidecar/telemetry"
	"github.com/timing-sidecar/timing-sidecar/telemetry/usage"
)

// policy is what a request's plan is made from.
func (c *Config) policy() rewrite.Policy {
	return rewrite.Policy{Mode: c.Mode, UpgradeNonStreaming: c.UpgradeNonStreaming,
		ForwardIncludeMetrics: c.ForwardIncludeMetrics, InjectUsage: c.InjectUsage, ForceUsage: c.ForceIncludeUsage}
}

// Defaults. They are safe for multi-minute streams: nothing bounds the
// length of a response, only silences and the request's own transfer.
const (
	DefaultListen                 = ":8001"
	DefaultUpstream               = "http://127.0.0.1:8000"
	DefaultMode                   = rewrite.ModeVLLM
	DefaultUpstreamConnectTimeout = 5 * time.Second
	// Zero: a non-streaming generation is silent until it is done, and may
	// take many minutes; the client's own timeout decides, and the sidecar
	// aborts the upstream request when the client gives up.
	DefaultUpstreamHeaderTimeout = 0
	DefaultUpstreamIdleTimeout   = 5 * time.Minute
	// Below uvicorn's 5 s keep-alive, so the sidecar retires a pooled
	// connection before the engine closes it under a new request.
	DefaultUpstreamKeepAlive = 4 * time.Second
	DefaultClientReadTimeout = 60 * time.Second
	DefaultClientIdleTimeout = 120 * time.Second
	// nginx's send_timeout.
	DefaultClientWriteTimeout = 60 * time.Second
	// vLLM sends the usage event right after the finishing one, in the
	// same loop iteration: microseconds apart. 100 ms covers any engine
	// under load and is under what a person notices.
	DefaultMaxEventHold       = 100 * time.Millisecond
	DefaultMaxRequestBodySize = 64 << 20
	// Room for one body at the size limit and a half more: with the
	// runtime and the connections it fits the manifests' 256Mi limit
	// (deploy/README.md, "Memory").
	DefaultMaxBodyMemory = 96 << 20
	// nginx's default for one request header line; the server holds a
	// buffer this big per connection, streams included.
	DefaultMaxRequestHeaderSize = 8 << 10
	// nginx's default proxy_buffer_size on x86-64: the engine's response
	// headers must fit; each upstream connection holds a buffer this big.
	DefaultMaxResponseHeaderSize = 4 << 10
	DefaultMaxBufferedResponse   = 16 << 20
	DefaultMaxEventSize          = 64 << 10
	DefaultAdminListen           = ":9101"
	DefaultAccessLog             = true
	DefaultKernelTimestamps      = true
	DefaultInjectUsage           = true
	DefaultMaxModelLabels        = 32
	DefaultMaxTenantLabels       = 32
	DefaultMaxVariantLabels      = 8
	DefaultDebugRequests         = DebugLoopback // an experiment's two or three arms, and room for overlapping ones
	DefaultReadinessProbe        = ProbeHTTP
	DefaultReadinessPath         = "/health"
	DefaultReadinessInterval     = 2 * time.Second
	// Shorter than Kubernetes' default 30 s terminationGracePeriodSeconds.
	DefaultShutdownGrace = 25 * time.Second
	DefaultDrainDelay    = 5 * time.Second
	// llm-d's: its scheduler reads a request's objectives from these.
	DefaultSLOTTFTHeader = "x-llm-d-slo-ttft-ms"
	DefaultSLOITLHeader  = "x-llm-d-slo-tpot-ms"
)

// Readiness probes of the engine.
const (
	// ProbeHTTP is a GET of the readiness path that must answer 2xx.
	ProbeHTTP = "http"
	// ProbeTCP is a TCP connect.
	ProbeTCP = "tcp"
)

// Config is everything the proxy needs; the binary fills it from flags.
type Config struct {
	// Listen is the address clients connect to.
	Listen string
	// Upstream is the engine's base URL (scheme and host[:port] only).
	Upstream string
	// UpstreamCAFile, when set, is a PEM file of the certificate
	// authorities the engine's certificate must chain to (an https
	// upstream), in place of the system's: an engine serving a
	// certificate of a private CA. UpstreamServerName, when set, is the
	// name its certificate must carry, in place of the upstream URL's host
	// (an engine reached by IP, or by a name its certificate lacks).
	UpstreamCAFile, UpstreamServerName string
	// TLSCertFile and TLSKeyFile, when set, make the client port serve
	// HTTPS with them; TLSClientCAFile and TLSClientCerts check client
	// certificates (tlsserve.ClientCertNone, ClientCertOptional,
	// ClientCertRequired), as vLLM's --ssl-* do. The files are re-read
	// when they change, for new connections.
	TLSCertFile, TLSKeyFile, TLSClientCAFile string
	TLSClientCerts                           int
	// Mode selects which requests get metrics.
	Mode rewrite.Mode
	// UpstreamConnectTimeout bounds dialing the engine.
	UpstreamConnectTimeout time.Duration
	// UpstreamHeaderTimeout bounds the wait for the engine's response
	// headers once the request is sent; 0 waits as long as the client does.
	UpstreamHeaderTimeout time.Duration
	// UpstreamIdleTimeout bounds the silence between two reads of a
	// response body from the engine (between stream events); 0 disables it.
	UpstreamIdleTimeout time.Duration
	// UpstreamKeepAlive is how long an idle pooled upstream connection is
	// kept for reuse.
	UpstreamKeepAlive time.Duration
	// ClientReadTimeout bounds reading one whole client request, headers and
	// body; it also ends clients that send headers slowly.
	ClientReadTimeout time.Duration
	// ClientIdleTimeout bounds a client keep-alive connection's wait for its
	// next request.
	ClientIdleTimeout time.Duration
	// ClientWriteTimeout bounds how long a write to a client may wait: a
	// client that stops reading is cut, and its engine request aborted;
	// 0 disables it.
	ClientWriteTimeout time.Duration
	// MaxEventHold bounds how long an event that finishes the choices
	// waits for the usage that decides its metrics (--max-event-hold).
	MaxEventHold time.Duration
	// MaxRequestBodySize is the largest request body accepted (413 above).
	MaxRequestBodySize int
	// MaxBodyMemory bounds the request bodies held in memory at once; a
	// body with no room streams through unread (proxy/membudget).
	MaxBodyMemory int
	// MaxRequestHeaderSize is the largest request header block accepted
	// (431 above).
	MaxRequestHeaderSize int
	// MaxResponseHeaderSize is the largest header block accepted from the
	// engine (502 above).
	MaxResponseHeaderSize int
	// MaxBufferedResponse is the largest non-streaming response buffered to
	// add metrics; a larger one passes through without them.
	MaxBufferedResponse int
	// MaxEventSize is the largest stream event that is inspected; larger
	// events pass through intact, uninspected.
	MaxEventSize int

	// AdminListen is the address of /metrics, /healthz and /readyz.
	AdminListen string
	// AdminPprof serves Go's profiler under /debug/pprof/ on the admin port.
	AdminPprof bool
	// DebugRequests says who the /debug/requests page answers on the
	// admin port (DebugLoopback, DebugAny), or DebugOff: then nothing is
	// recorded for it. TraceURL is the link of a request's trace there,
	// {trace_id} standing for its id; empty, none.
	DebugRequests string
	TraceURL      string
	// AccessLog writes one JSON line per request.
	AccessLog bool
	// KernelTimestamps takes every mark from the kernel's receive time of
	// the bytes that completed it, where the platform gives one (Linux);
	// off, or elsewhere, a mark is the clock at the read.
	KernelTimestamps bool
	// InjectUsage asks the engine for usage on streams whose client did
	// not, and removes that usage event before it reaches the client.
	InjectUsage bool
	// ForceIncludeUsage gives every stream's client the usage event, as
	// vLLM's --enable-force-include-usage does.
	ForceIncludeUsage bool
	// ForwardIncludeMetrics leaves include_metrics in the request, for an
	// engine build that reads it (released vLLM ignores it).
	ForwardIncludeMetrics bool
	// UpgradeNonStreaming sends an eligible non-streaming chat or
	// completions request to the engine as a stream, measures it as one
	// and reassembles the response the client asked for, so non-streaming
	// requests get queue time, TTFT and ITL too.
	UpgradeNonStreaming bool
	// MaxModelLabels bounds the distinct "model" label values.
	MaxModelLabels int
	// DisaggregationLeg is the leg the engine serves of requests SGLang's
	// router splits (rewrite.Request.Bootstrapped): "prefill", "decode",
	// or empty for an engine that serves whole requests.
	DisaggregationLeg string
	// TenantHeader names the request header that carries the tenant.
	TenantHeader string
	// TenantLabel adds the tenant as a label to the request and token
	// counters; MaxTenantLabels bounds its values.
	TenantLabel     bool
	MaxTenantLabels int
	// Variant is the deployment's arm of a latency experiment (a canary
	// Deployment's "canary"), and VariantHeader the request header that
	// names a request's own arm (set by the gateway that splits traffic),
	// which wins over Variant. Either set labels every figure with the
	// request's arm; MaxVariantLabels bounds the label's values.
	Variant, VariantHeader string
	MaxVariantLabels       int
	// ReadinessProbe is how /readyz checks the engine: ProbeHTTP or
	// ProbeTCP; ReadinessPath is the HTTP probe's path; the probe runs
	// every ReadinessInterval and /readyz answers from its last result.
	ReadinessProbe    string
	ReadinessPath     string
	ReadinessInterval time.Duration

	// CPURequest is the container's CPU request, a Kubernetes quantity
	// ("1", "500m"; the manifests pass it from the downward API): the
	// sidecar's parallelism when it has no CPU limit (see parallelism).
	CPURequest string

	// ShutdownGrace is the longest time from SIGTERM to exit: requests in
	// flight, streams included, get until then to finish.
	ShutdownGrace time.Duration
	// DrainDelay is how long after SIGTERM new connections are still
	// accepted (with /readyz failing), while load balancers catch up.
	DrainDelay time.Duration

	// SLOTTFT, SLOITL and SLOE2E are the latency objectives each request
	// is judged against (time to first token from arrival, mean
	// inter-token latency, end to end); zero leaves one unset. See
	// telemetry.Objectives.
	SLOTTFT, SLOITL, SLOE2E time.Duration
	// SLOTTFTHeader and SLOITLHeader name the request headers that carry
	// a request's own TTFT and ITL objectives in milliseconds, which
	// replace SLOTTFT and SLOITL for it; empty reads none.
	SLOTTFTHeader, SLOITLHeader string

	// Usage says whether and where the usage records go.
	Usage usage.Config
	// OTLP says whether and where measured requests' spans, the
	// OpenTelemetry GenAI metrics and the usage records' log records go;
	// each signal is off unless an OTLP endpoint is set for it (see
	// telemetry.OTLPConfig).
	OTLP telemetry.OTLPConfig
}

// DefaultConfig returns a Config with every default applied.
func DefaultConfig() Config {
	return Config{
		Listen:                 DefaultListen,
		Upstream:               DefaultUpstream,
		Mode:                   DefaultMode,
		UpstreamConnectTimeout: DefaultUpstreamConnectTimeout,
		UpstreamHeaderTimeout:  DefaultUpstreamHeaderTimeout,
		UpstreamIdleTimeout:    DefaultUpstreamIdleTimeout,
		UpstreamKeepAlive:      DefaultUpstreamKeepAlive,
		ClientReadTimeout:      DefaultClientReadTimeout,
		ClientIdleTimeout:      DefaultClientIdleTimeout,
		ClientWriteTimeout:     DefaultClientWriteTimeout,
		MaxEventHold:           DefaultMaxEventHold,
		MaxRequestBodySize:     DefaultMaxRequestBodySize,
		MaxBodyMemory:          DefaultMaxBodyMemory,
		MaxRequestHeaderSize:   DefaultMaxRequestHeaderSize,
		MaxResponseHeaderSize:  DefaultMaxResponseHeaderSize,
		MaxBufferedResponse:    DefaultMaxBufferedResponse,
		MaxEventSize:           DefaultMaxEventSize,
		AdminListen:            DefaultAdminListen,
		AccessLog:              DefaultAccessLog,
		KernelTimestamps:       DefaultKernelTimestamps,
		InjectUsage:            DefaultInjectUsage,
		MaxModelLabels:         DefaultMaxModelLabels,
		MaxTenantLabels:        DefaultMaxTenantLabels,
		MaxVariantLabels:       DefaultMaxVariantLabels,
		DebugRequests:          DefaultDebugRequests,
		ReadinessProbe:         DefaultReadinessProbe,
		ReadinessPath:          DefaultReadinessPath,
		ReadinessInterval:      DefaultReadinessInterval,
		ShutdownGrace:          DefaultShutdownGrace,
		DrainDelay:             DefaultDrainDelay,
		SLOTTFTHeader:          DefaultSLOTTFTHeader,
		SLOITLHeader:           DefaultSLOITLHeader,
		Usage:                  usage.DefaultConfig(),
	}
}

// Validate returns every problem in the configuration at once. Each
// group below lists its checks' errors, nil for a check that passed;
// errors.Join drops the nils and keeps the order.
func (c *Config) Validate() error {
	return errors.Join(slices.Concat(
		[]error{
			addressProblem("listen address", c.Listen),
			addressProblem("admin listen address", c.AdminListen),
			c.objectivesProblem(),
			cpuRequestError(c.CPURequest),
		},
		c.readinessProblems(),
		[]error{c.shutdownProblem(), c.tenantProblem(), c.upstreamProblem(), c.modeProblem(), c.legProblem(), c.debugProblem()},
		c.durationProblems(),
		c.tlsProblems(),
		[]error{c.connectTimeoutProblem()},
		c.sizeProblems(),
	)...)
}

func addressProblem(name, addr string) error {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("%s %q: %w", name, addr, err)
	}
	return nil
}

func (c *Config) objectivesProblem() error {
	if c.SLOTTFT < 0 || c.SLOITL < 0 || c.SLOE2E < 0 {
		return fmt.Errorf("latency objectives %v, %v, %v: want positive, or 0 for none", c.SLOTTFT, c.SLOITL, c.SLOE2E)
	}
	return nil
}

func (c *Config) readinessProblems() []error {
	var errs []error
	switch c.ReadinessProbe {
	case ProbeHTTP, ProbeTCP:
	default:
		errs = append(errs, fmt.Errorf("readiness probe %q: want http or tcp", c.ReadinessProbe))
	}
	if c.ReadinessInterval <= 0 {
		errs = append(errs, fmt.Errorf("readiness interval %v: must be positive", c.ReadinessInterval))
	}
	if c.ReadinessProbe == ProbeHTTP && (c.ReadinessPath == "" || c.ReadinessPath[0] != '/') {
		errs = append(errs, fmt.Errorf("readiness path %q: must start with /", c.ReadinessPath))
	}
	return errs
}

func (c *Config) shutdownProblem() error {
	if c.DrainDelay < 0 || c.ShutdownGrace <= 0 || c.DrainDelay > c.ShutdownGrace {
		return fmt.Errorf("drain delay %v and shutdown grace %v: want 0 ≤ drain delay ≤ shutdown grace, grace positive", c.DrainDelay, c.ShutdownGrace)
	}
	return nil
}

func (c *Config) tenantProblem() error {
	if c.TenantLabel && c.TenantHeader == "" {
		return errors.New("tenant label needs a tenant header to read it from")
	}
	return nil
}

func (c *Config) upstreamProblem() error {
	_, err := upstream.ParseURL(c.Upstream)
	return err
}

func (c *Config) modeProblem() error {
	switch c.Mode {
	case rewrite.ModeOff, rewrite.ModeVLLM, rewrite.ModeOptIn, rewrite.ModeAlways:
		return nil
	}
	return fmt.Errorf("per-request metrics mode %q: want off, vllm, opt-in or always", c.Mode)
}

// Who the /debug/requests page answers: loopback peers, any peer, or
// none (nothing recorded for it).
const (
	DebugLoopback = "loopback"
	DebugAny      = "any"
	DebugOff      = "off"
)

func (c *Config) debugProblem() error {
	switch c.DebugRequests {
	case DebugLoopback, DebugAny, DebugOff:
		return nil
	}
	return fmt.Errorf("debug requests %q: want loopback, any or off", c.DebugRequests)
}

// durationProblems checks the timeouts, where 0 means none.
func (c *Config) durationProblems() []error {
	var errs []error
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"upstream connect timeout", c.UpstreamConnectTimeout},
		{"upstream header timeout", c.UpstreamHeaderTimeout},
		{"upstream idle timeout", c.UpstreamIdleTimeout},
		{"upstream keep-alive", c.UpstreamKeepAlive},
		{"client read timeout", c.ClientReadTimeout},
		{"client idle timeout", c.ClientIdleTimeout},
		{"client write timeout", c.ClientWriteTimeout},
		{"max event hold", c.MaxEventHold},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s %v: must not be negative", d.name, d.v))
		}
	}
	return errs
}

func (c *Config) tlsProblems() []error {
	var errs []error
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		errs = append(errs, errors.New("TLS needs both a certificate file and a key file"))
	}
	if c.TLSClientCerts < tlsserve.ClientCertNone || c.TLSClientCerts > tlsserve.ClientCertRequired {
		errs = append(errs, fmt.Errorf("client certificate requirement %d: must be 0 (none), 1 (optional) or 2 (required)", c.TLSClientCerts))
	}
	if c.TLSClientCerts != tlsserve.ClientCertNone && (c.TLSClientCAFile == "" || c.TLSCertFile == "") {
		errs = append(errs, errors.New("client certificates need a client CA file and the server's own certificate"))
	}
	return errs
}

// connectTimeoutProblem: unlike the other timeouts, dialing must be
// bounded.
func (c *Config) connectTimeoutProblem() error {
	if c.UpstreamConnectTimeout == 0 {
		return errors.New("upstream connect timeout must be positive")
	}
	return nil
}

// sizeProblems checks the size and count limits against their minimums.
func (c *Config) sizeProblems() []error {
	var errs []error
	for _, s := range []struct {
		name string
		v    int
		min  int
	}{
		{"max request body size", c.MaxRequestBodySize, 1},
		{"max body memory", c.MaxBodyMemory, 1},
		{"max request header size", c.MaxRequestHeaderSize, 1024},
		{"max response header size", c.MaxResponseHeaderSize, 1024},
		{"max buffered response", c.MaxBufferedResponse, 1},
		{"max event size", c.MaxEventSize, 1024},
		{"max model labels", c.MaxModelLabels, 1},
		{"max tenant labels", c.MaxTenantLabels, 1},
		{"max variant labels", c.MaxVariantLabels, 1},
	} {
		if s.v < s.min {
			errs = append(errs, fmt.Errorf("%s %d: must be at least %d", s.name, s.v, s.min))
		}
	}
	return errs
}

func cpuRequestError(s string) error {
	_, err := ParseCPU(s)
	return err
}

// legProblem refuses a disaggregation leg other than prefill or decode.
func (c *Config) legProblem() error {
	switch c.DisaggregationLeg {
	case "", "prefill", "decode":
		return nil
	}
	return fmt.Errorf("disaggregation leg %q: want prefill, decode or empty", c.DisaggregationLeg)
}
