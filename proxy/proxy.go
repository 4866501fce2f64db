package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/timing-sidecar/timing-sidecar/proxy/tlsserve"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/timing-sidecar/timing-sidecar/proxy/clientconn"
	"github.com/timing-sidecar/timing-sidecar/proxy/membudget"
	"github.com/timing-sidecar/timing-sidecar/proxy/upstream"
	"github.com/timing-sidecar/timing-sidecar/rewrite"
	"github.com/timing-sidecar/timing-sidecar/telemetry"
	"github.com/timing-sidecar/timing-sidecar/telemetry/requests"
	"github.com/timing-sidecar/timing-sidecar/telemetry/usage"
	"github.com/timing-sidecar/timing-sidecar/timing"
)

// Proxy is the sidecar's HTTP server, its upstream client and its admin
// endpoints.
type Proxy struct {
	cfg Config
	// policy is the part of cfg a request's plan is made from.
	policy rewrite.Policy
	// bootstrapLeg is the leg the engine serves of SGLang-split
	// requests (cfg.DisaggregationLeg).
	bootstrapLeg rewrite.Leg
	log          *slog.Logger
	up           *upstream.Client
	server       *fasthttp.Server
	pools        *pools
	registry     *prometheus.Registry
	telemetry    *telemetry.Recorder
	// tracer is nil when tracing is off, genai when the OTLP GenAI
	// metrics are.
	tracer *telemetry.Tracer
	genai  *telemetry.GenAIMetrics
	// debug keeps the requests /debug/requests shows; nil when it is off.
	debug *requests.Store
	// usage is nil when the usage records are off.
	usage *usage.Records
	// engineAddress and enginePort are the engine's, for spans.
	engineAddress string
	enginePort    int
	admin         *http.Server
	prober        *http.Client
	ready         readiness
	probeOnce     sync.Once
	stop          chan struct{}
	stopOnce      sync.Once
	// streams are the responses being streamed, for Shutdown to drain.
	streams *streamSet
	// clientHold, when set (tests only), runs before each read from a
	// client.
	clientHold func()
	// clientBlocked, when set (tests only), runs when a write to a client
	// first waits for room in its socket; clientSendBuffer, when set
	// (tests only), sizes client sockets' send buffers.
	clientBlocked    func()
	clientSendBuffer int
	// idle are the client connections waiting for their next request,
	// closed when the drain begins.
	idle idleClients
	// bodies bounds the memory request bodies hold.
	bodies *membudget.Budget
	// tls, when set, is what the client port serves HTTPS with.
	tls *tls.Config
}

// New checks cfg and builds a Proxy. log gets operational messages;
// accessLog, if not nil and cfg.AccessLog is on, gets one JSON line per
// request.
func New(cfg Config, log *slog.Logger, accessLog io.Writer) (*Proxy, error) {
	otlp, otlpErr := cfg.OTLP.Resolve(log)
	if err := errors.Join(cfg.Validate(), otlpErr, errors.Join(cfg.Usage.Problems(otlp.Logs.Own)...)); err != nil {
		return nil, fmt.Errorf("invalid configuration:\n%w", err)
	}
	up, err := upstream.New(upstream.Config{URL: cfg.Upstream,
		ConnectTimeout: cfg.UpstreamConnectTimeout, HeaderTimeout: cfg.UpstreamHeaderTimeout,
		IdleTimeout: cfg.UpstreamIdleTimeout, KeepAlive: cfg.UpstreamKeepAlive,
		MaxHeaderSize: cfg.MaxResponseHeaderSize, KernelStamps: cfg.KernelTimestamps,
		CAFile: cfg.UpstreamCAFile, ServerName: cfg.UpstreamServerName})
	if err != nil {
		return nil, err
	}
	serveTLS, err := tlsserve.Config(tlsserve.Files{Cert: cfg.TLSCertFile, Key: cfg.TLSKeyFile, ClientCA: cfg.TLSClientCAFile}, cfg.TLSClientCerts, log)
	if err != nil {
		return nil, err
	}
	p := &Proxy{cfg: cfg, policy: cfg.policy(), bootstrapLeg: rewrite.LegNamed(cfg.DisaggregationLeg), log: log, up: up, pools: newPools(cfg.MaxEventSize), registry: telemetry.NewRegistry(), stop: make(chan struct{}), streams: newStreamSet(),
		bodies: membudget.New(cfg.MaxBodyMemory), tls: serveTLS}
	if cfg.DebugRequests != DebugOff {
		p.debug = requests.New(requests.Options{})
	}
	opts := telemetry.Options{MaxModels: cfg.MaxModelLabels, TenantLabel: cfg.TenantLabel, MaxTenants: cfg.MaxTenantLabels,
		VariantLabel: cfg.Variant != "" || cfg.VariantHeader != "", MaxVariants: cfg.MaxVariantLabels, Variant: cfg.Variant,
		Objectives:       telemetry.Objectives{TTFT: cfg.SLOTTFT, ITL: cfg.SLOITL, E2E: cfg.SLOE2E},
		KernelTimestamps: up.KernelStamps()}
	if cfg.AccessLog && accessLog != nil {
		opts.AccessLog, opts.Log = accessLog, log
	}
	if p.tracer, err = telemetry.NewTracer(otlp, p.registry, log); err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	opts.Tracer = p.tracer
	p.engineAddress, p.enginePort = splitHostPort(up.Host(), 0)
	if p.genai, err = telemetry.NewGenAIMetrics(otlp, p.registry, log, p.engineAddress, p.enginePort); err != nil {
		return nil, fmt.Errorf("OTLP metrics: %w", err)
	}
	opts.GenAI = p.genai
	if p.usage, opts.UsageEnvelope, err = openUsage(&cfg, otlp, p.registry, log); err != nil {
		return nil, fmt.Errorf("usage records: %w", err)
	}
	if p.usage != nil {
		opts.Usage = p.usage
	}
	p.telemetry = telemetry.NewRecorder(p.registry, opts)
	p.admin = &http.Server{Handler: p.AdminHandler(), ReadHeaderTimeout: 10 * time.Second,
		// Scrapers and probes keep connections alive between visits;
		// one silent for longer than any scrape interval is closed.
		IdleTimeout: adminIdleTimeout, MaxHeaderBytes: 16 << 10}
	p.prober = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	p.server = &fasthttp.Server{
		Handler:       p.handle,
		ErrorHandler:  p.handleBadRequest,
		ExpectHandler: p.expectContinue,
		// Nothing bounds a response: a generation may stream for minutes.
		WriteTimeout:       0,
		ReadTimeout:        cfg.ClientReadTimeout,
		IdleTimeout:        cfg.ClientIdleTimeout,
		MaxRequestBodySize: cfg.MaxRequestBodySize,
		// The handler reads bodies itself, within the budget (readBody).
		StreamRequestBody: true,
		ReadBufferSize:    cfg.MaxRequestHeaderSize,
		// The engine's Server passes through. fasthttp manages Date itself
		// (it drops a copied one), so the sidecar's clock dates responses.
		NoDefaultServerHeader:         true,
		NoDefaultContentType:          true,
		DisablePreParseMultipartForm:  true,
		DisableHeaderNamesNormalizing: false,
		CloseOnShutdown:               true,
		// fasthttp's own errors leave out the bytes of a request it could
		// not parse (fasthttpLogger cuts them as well).
		SecureErrorLogMessage: true,
		// A worker serves one connection for its whole life; idle ones
		// wait here for the next connection. Two seconds (not fasthttp's
		// ten) gives back a burst's goroutines and their grown stacks soon
		// after it, and costs a goroutine start per new connection.
		MaxIdleWorkerDuration: 2 * time.Second,
		// ReduceMemoryUsage would free the read buffer during a stream,
		// but it also turns a silent new connection's timeout into a
		// close without the 408 and lets a slow first request run for up
		// to twice the read timeout; the buffer is kept instead, and the
		// header size limit sized for it.
		Logger: fasthttpLogger{log},
		// Which connections wait for a next request, for the drain.
		ConnState: p.idle.track,
	}
	return p, nil
}

// drain begins the shutdown's drain (SIGTERM): /readyz fails, every
// response from now on carries Connection: close, the client connections
// idle between requests are closed now, and those in use as soon as their
// response is out, so that each client's next request opens a connection
// the load balancer sends elsewhere, rather than racing the close of an
// idle one when the drain ends. New connections are still served until
// Shutdown.
func (p *Proxy) drain() {
	p.ready.stopping.Store(true)
	p.idle.closeAll()
}

// idleClients tracks client connections between requests. A connection
// whose next request has begun to arrive is no longer idle (fasthttp
// reports it active on its first bytes), and the lock that closeAll holds
// keeps that report from crossing a close; bytes still in the kernel when
// an idle connection closes are the race every server that closes idle
// keep-alive connections has, nginx's at its graceful shutdown too.
type idleClients struct {
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	draining bool
}

// track is the server's ConnState hook. A connection becomes idle once its
// response is flushed (the handler sets a write deadline, which makes
// fasthttp flush every response), so while draining it is closed then.
func (ic *idleClients) track(c net.Conn, state fasthttp.ConnState) {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	if state == fasthttp.StateIdle && ic.draining {
		c.Close() //nolint:errcheck // it is gone either way
		delete(ic.conns, c)
		return
	}
	if state == fasthttp.StateIdle {
		if ic.conns == nil {
			ic.conns = make(map[net.Conn]struct{})
		}
		ic.conns[c] = struct{}{}
		return
	}
	delete(ic.conns, c)
}

func (ic *idleClients) closeAll() {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	ic.draining = true
	for c := range ic.conns {
		c.Close() //nolint:errcheck // it is gone either way
		delete(ic.conns, c)
	}
}

// markClock names the clock the marks are read from, for the start-up log.
func (p *Proxy) markClock() string {
	switch {
	case p.up.KernelStamps():
		return "kernel receive time"
	case p.cfg.KernelTimestamps:
		return "clock at the read (this platform gives no kernel receive times)"
	default:
		return "clock at the read (--kernel-timestamps=false)"
	}
}

// handleBadRequest answers a request fasthttp could not read, and counts it.
func (p *Proxy) handleBadRequest(ctx *fasthttp.RequestCtx, err error) {
	e := requestError(err)
	p.refuse(ctx, e)
	if e.Status != fasthttp.StatusRequestTimeout {
		// The client may still be sending; a silent one is not waited for.
		clientconn.CloseAfterError(ctx)
	}
}

// expectContinue answers "Expect: 100-continue": a request the sidecar
// will refuse is refused before its client sends the body, not after.
// (fasthttp's documentation asks an ExpectHandler to leave the response
// alone; it only sets the status after, so the error body stays, which
// TestExpectContinueRefusesAtOnce checks.)
func (p *Proxy) expectContinue(ctx *fasthttp.RequestCtx) int {
	e := checkRequest(&ctx.Request.Header)
	if e == nil && ctx.Request.Header.ContentLength() > p.cfg.MaxRequestBodySize {
		tooLarge := requestError(fasthttp.ErrBodyTooLarge)
		e = &tooLarge
	}
	if e == nil {
		return fasthttp.StatusContinue
	}
	p.refuse(ctx, *e)
	clientconn.CloseAfterError(ctx)
	return e.Status
}

// refuse answers a request that is not forwarded, and counts it.
func (p *Proxy) refuse(ctx *fasthttp.RequestCtx, e apiError) {
	p.telemetry.Begin()
	// Arrival as the handler takes it, when what was read of the request
	// arrived: the record's Elapsed, a refusal's duration in the GenAI
	// metrics, is then real.
	arrival := time.Now()
	if cc, ok := ctx.Conn().(*clientconn.Conn); ok {
		arrival = cc.Arrival()
	}
	e.write(ctx)
	p.record(&flight{clock: timing.Clock{Arrival: arrival}, rec: telemetry.Record{Method: string(ctx.Method()), Path: string(ctx.Path()),
		Endpoint: routeOf(ctx.Path()).label, Status: e.Status}})
}

// Serve answers requests on ln until Shutdown.
func (p *Proxy) Serve(ln net.Listener) error {
	return p.server.Serve(clientconn.Listener{Listener: ln, KernelStamps: p.up.KernelStamps(), WriteTimeout: p.cfg.ClientWriteTimeout, Hold: p.clientHold, Blocked: p.clientBlocked, SendBuffer: p.clientSendBuffer, TLS: p.tls})
}

// Shutdown fails readiness, stops accepting connections and waits, until
// ctx is done, for requests in flight to finish.
func (p *Proxy) Shutdown(ctx context.Context) error {
	p.ready.stopping.Store(true)
	p.stopOnce.Do(func() { close(p.stop) })
	defer p.up.CloseIdle()
	// The admin port stays up while requests drain: /readyz keeps saying
	// "shutting down", /healthz keeps the pod alive, /metrics counts the
	// last requests.
	err := p.server.ShutdownWithContext(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = errInFlightAtGrace
	}
	// The streams fasthttp does not wait for (HTTP/1.0's, on hijacked
	// connections) drain too; at the grace's end every stream still open
	// is cut, and recorded with what it sent.
	if n := p.streams.drain(ctx, cutEndWait); n > 0 {
		err = streamsCut{n: n}
	}
	// Requests have ended (or the grace has: then requests other than
	// streams still open lose their log lines, counted, and their spans):
	// the access log's last lines, and the queued spans, go out in what is
	// left of it, and the lines of streams cut get cutEndWait past it.
	flush := ctx
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		flush, cancel = context.WithTimeout(context.WithoutCancel(ctx), cutEndWait)
		defer cancel()
	}
	// The three outputs flush side by side, each with all that is left:
	// one that hangs (a trace collector, an unread stdout) cannot starve
	// the others, and none waits for the sum of their times.
	var terr, merr error
	var outputs sync.WaitGroup
	outputs.Go(func() { p.telemetry.Close(flush) })
	if p.usage != nil {
		outputs.Go(func() {
			// What no sink has by the grace's end stays in the spool for
			// the next start on the same directory.
			if left := p.usage.Close(flush); len(left) > 0 {
				p.log.Warn("usage records left in the spool at shutdown; delivered after the next start", "pending", left)
			}
		})
	}
	outputs.Go(func() { terr = p.tracer.Shutdown(ctx) })
	outputs.Go(func() { merr = p.genai.Shutdown(flush) })
	outputs.Wait()
	if errors.Is(terr, context.DeadlineExceeded) {
		err = errors.Join(err, errSpansAtGrace)
	} else if terr != nil {
		err = errors.Join(err, fmt.Errorf("export the last spans: %w", terr))
	}
	if merr != nil {
		// The collector is down or slow: the last interval's figures are
		// lost, as its failed exports are counted; not an error of the
		// requests.
		p.log.Warn("the last GenAI metrics were not exported", "err", merr)
	}
	return errors.Join(err, p.admin.Shutdown(ctx))
}

// withoutGraceEnds is err without the grace's ends, which are warnings.
func withoutGraceEnds(err error) error {
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		if errors.Is(err, errInFlightAtGrace) || errors.Is(err, errSpansAtGrace) {
			return nil
		}
		return err
	}
	var rest []error
	for _, e := range joined.Unwrap() {
		if e = withoutGraceEnds(e); e != nil {
			rest = append(rest, e)
		}
	}
	return errors.Join(rest...)
}

// The shutdown grace ran out with requests still in flight, or before the
// last spans were exported (a collector that hangs): each is said as
// what it is, and neither is a failure of the process.
var (
	errInFlightAtGrace = errors.New("shutdown grace over with requests in flight")
	errSpansAtGrace    = errors.New("shutdown grace over before the last spans were exported")
)

// Run listens on cfg.Listen and cfg.AdminListen and serves until ctx is
// cancelled (SIGTERM), then shuts down gracefully: /readyz fails at once;
// new connections are still accepted for the drain delay, while load
// balancers stop sending; then the listeners close and requests in flight,
// streams included, get the rest of the shutdown grace to finish.
func Run(ctx context.Context, cfg Config, log *slog.Logger, accessLog io.Writer) error {
	p, err := New(cfg, log, accessLog)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	adminLn, err := net.Listen("tcp", cfg.AdminListen)
	if err != nil {
		ln.Close()
		return fmt.Errorf("admin listen on %s: %w", cfg.AdminListen, err)
	}
	procs, procsFrom := sizeParallelism(cfg.CPURequest)
	log.Info("timing-sidecar listening", "listen", ln.Addr().String(), "admin_listen", adminLn.Addr().String(),
		"upstream", cfg.Upstream, "per_request_metrics", string(cfg.Mode), "mark_clock", p.markClock(), "tls", p.tls != nil,
		"parallelism", procs, "parallelism_from", procsFrom, "usage_records", p.usageSinks())
	served := make(chan error, 2)
	go func() { served <- p.Serve(ln) }()
	go func() { served <- p.ServeAdmin(adminLn) }()
	select {
	case err := <-served:
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		p.Shutdown(ctx) //nolint:errcheck // the serve error is the one to report
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	deadline := time.Now().Add(cfg.ShutdownGrace)
	p.drain()
	log.Info("timing-sidecar shutting down: not ready, draining", "drain_delay", cfg.DrainDelay.String(), "shutdown_grace", cfg.ShutdownGrace.String())
	time.Sleep(cfg.DrainDelay)
	shutdownCtx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	err = p.Shutdown(shutdownCtx)
	var cut streamsCut
	switch {
	case errors.As(err, &cut):
		log.Warn("shutdown grace over; cut the streams still in flight, each recorded with what it sent", "streams_cut", cut.n)
	case errors.Is(err, errInFlightAtGrace):
		log.Warn("shutdown grace over; closing the requests still in flight")
	}
	if errors.Is(err, errSpansAtGrace) {
		log.Warn("shutdown grace over before the last spans reached the collector; they are dropped")
	}
	if err = withoutGraceEnds(err); err != nil {
		return fmt.Errorf("shut down: %w", err)
	}
	log.Info("timing-sidecar stopped", "streams_cut", cut.n)
	return nil
}

// fasthttpLogger sends fasthttp's own messages to slog at debug level:
// they are connection errors the client has already been answered about,
// or clients that left.
type fasthttpLogger struct{ log *slog.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	if !l.log.Enabled(context.Background(), slog.LevelDebug) {
		return // not formatted for nothing
	}
	l.log.Debug(redactRequestBytes(fmt.Sprintf(format, args...)), "source", "fasthttp")
}

// redactRequestBytes cuts from a fasthttp message the bytes of the message
// it could not parse, which fasthttp quotes (a request line, or headers
// whole) and which may hold credentials, prompts or another client's
// output. Only the quoted addresses that open a connection's error stay:
// everything from the first other quote on is cut.
func redactRequestBytes(msg string) string {
	const cut = "(message bytes not shown)"
	const serving = `error when serving connection "`
	head, rest := "", msg
	if strings.HasPrefix(msg, serving) {
		// `error when serving connection "a"<->"b": `; addresses hold no
		// `": `, so its first one ends them.
		if i := strings.Index(msg[len(serving):], `": `); i >= 0 {
			head, rest = msg[:len(serving)+i+3], msg[len(serving)+i+3:]
		}
	}
	for _, mark := range []string{`"`, "buffer size="} {
		if i := strings.Index(rest, mark); i >= 0 {
			rest = rest[:i] + cut
		}
	}
	return head + rest
}
