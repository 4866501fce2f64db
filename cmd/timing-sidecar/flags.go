package main

import (
	"github.com/urfave/cli/v2"

	"github.com/timing-sidecar/timing-sidecar/proxy"
)

// serveFlags are the proxy's settings. Each has an environment variable;
// a flag on the command line wins over the environment.
func serveFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "listen", EnvVars: env("listen"), Value: proxy.DefaultListen,
			Usage: "Address the sidecar listens on for clients."},
		&cli.StringFlag{Name: "upstream", EnvVars: env("upstream"), Value: proxy.DefaultUpstream,
			Usage: "Base URL of the OpenAI-compatible engine (scheme, host and port only)."},
		&cli.StringFlag{Name: "per-request-metrics", EnvVars: env("per-request-metrics"), Value: string(proxy.DefaultMode),
			Usage: `Which responses get a "metrics" object: off (transparent proxy), opt-in (requests with "include_metrics": true) or always.`},
		&cli.DurationFlag{Name: "upstream-connect-timeout", EnvVars: env("upstream-connect-timeout"), Value: proxy.DefaultUpstreamConnectTimeout,
			Usage: "Longest wait to connect to the engine; past it the client gets a 504."},
		&cli.DurationFlag{Name: "upstream-header-timeout", EnvVars: env("upstream-header-timeout"), Value: proxy.DefaultUpstreamHeaderTimeout,
			Usage: "Longest wait for the engine's response headers after sending a request (504 past it); 0 waits as long as the client does, since a non-streaming generation sends nothing until it is done."},
		&cli.DurationFlag{Name: "upstream-idle-timeout", EnvVars: env("upstream-idle-timeout"), Value: proxy.DefaultUpstreamIdleTimeout,
			Usage: "Longest silence between two reads of a response body from the engine, such as between stream events; past it the response is cut and the client sees a truncated body. 0 disables it."},
		&cli.DurationFlag{Name: "upstream-keepalive", EnvVars: env("upstream-keepalive"), Value: proxy.DefaultUpstreamKeepAlive,
			Usage: "How long an idle connection to the engine is kept for reuse; keep it below the engine's own keep-alive (uvicorn: 5s)."},
		&cli.DurationFlag{Name: "client-read-timeout", EnvVars: env("client-read-timeout"), Value: proxy.DefaultClientReadTimeout,
			Usage: "Longest time to receive one whole client request, headers and body (408 past it); it also ends clients that send headers slowly. Responses have no time limit."},
		&cli.DurationFlag{Name: "client-idle-timeout", EnvVars: env("client-idle-timeout"), Value: proxy.DefaultClientIdleTimeout,
			Usage: "How long an idle client keep-alive connection waits for its next request."},
		&cli.IntFlag{Name: "max-request-body-size", EnvVars: env("max-request-body-size"), Value: proxy.DefaultMaxRequestBodySize,
			Usage: "Largest request body accepted, in bytes (413 above it)."},
		&cli.IntFlag{Name: "max-request-header-size", EnvVars: env("max-request-header-size"), Value: proxy.DefaultMaxRequestHeaderSize,
			Usage: "Largest request header block accepted, in bytes (431 above it)."},
		&cli.IntFlag{Name: "max-response-header-size", EnvVars: env("max-response-header-size"), Value: proxy.DefaultMaxResponseHeaderSize,
			Usage: "Largest response header block accepted from the engine, in bytes (502 above it, like nginx's proxy_buffer_size)."},
		&cli.IntFlag{Name: "max-buffered-response-size", EnvVars: env("max-buffered-response-size"), Value: proxy.DefaultMaxBufferedResponse,
			Usage: "Largest non-streaming response, in bytes, held in memory to add metrics; a larger one passes through without them."},
		&cli.IntFlag{Name: "max-event-size", EnvVars: env("max-event-size"), Value: proxy.DefaultMaxEventSize,
			Usage: "Largest stream event, in bytes, that is inspected; a larger one passes through intact but is not read for tokens or usage."},
		&cli.StringFlag{Name: "admin-listen", EnvVars: env("admin-listen"), Value: proxy.DefaultAdminListen,
			Usage: "Address of the admin endpoints: /metrics (the sidecar's Prometheus series), /healthz and /readyz. The engine's own /metrics stays on the proxied port."},
		&cli.BoolFlag{Name: "admin-pprof", EnvVars: env("admin-pprof"),
			Usage: "Serve Go's profiler under /debug/pprof/ on the admin port, for performance work."},
		&cli.BoolFlag{Name: "access-log", EnvVars: env("access-log"), Value: proxy.DefaultAccessLog,
			Usage: "Write one JSON line per request to standard output (never the prompt, the output or credentials)."},
		&cli.BoolFlag{Name: "inject-usage", EnvVars: env("inject-usage"), Value: proxy.DefaultInjectUsage,
			Usage: "For streams whose client did not ask for usage, ask the engine for it (exact token counts for Prometheus and the access log) and remove that usage event before it reaches the client."},
		&cli.BoolFlag{Name: "forward-include-metrics", EnvVars: env("forward-include-metrics"),
			Usage: "Leave include_metrics in the request for an engine that reports its own timing (vLLM with --enable-per-request-metrics); the engine's numbers then appear as metrics.engine beside the sidecar's. Default off: the field is removed, since strict servers reject unknown fields."},
		&cli.BoolFlag{Name: "upgrade-non-streaming", EnvVars: env("upgrade-non-streaming"),
			Usage: "Send non-streaming chat and completions requests to the engine as streams and reassemble the response, so they get queue time, time to first token and inter-token latency too. Only requests whose response a stream reproduces exactly are upgraded (see the README). Default off."},
		&cli.IntFlag{Name: "max-model-labels", EnvVars: env("max-model-labels"), Value: proxy.DefaultMaxModelLabels,
			Usage: `Distinct "model" label values kept in Prometheus series; further models count as "other".`},
		&cli.StringFlag{Name: "tenant-header", EnvVars: env("tenant-header"),
			Usage: "Request header that names the tenant (e.g. X-Tenant-Id), logged in the access log. Empty: no tenant."},
		&cli.BoolFlag{Name: "tenant-label", EnvVars: env("tenant-label"),
			Usage: `Also add the tenant as a "tenant" label to the request and token counters (needs --tenant-header).`},
		&cli.IntFlag{Name: "max-tenant-labels", EnvVars: env("max-tenant-labels"), Value: proxy.DefaultMaxTenantLabels,
			Usage: `Distinct "tenant" label values kept; further tenants count as "other".`},
		&cli.StringFlag{Name: "readiness-probe", EnvVars: env("readiness-probe"), Value: proxy.DefaultReadinessProbe,
			Usage: "How /readyz checks the engine: http (GET --readiness-path must answer 2xx) or tcp (a connect)."},
		&cli.StringFlag{Name: "readiness-path", EnvVars: env("readiness-path"), Value: proxy.DefaultReadinessPath,
			Usage: "The engine's path the http readiness probe requests."},
		&cli.DurationFlag{Name: "readiness-interval", EnvVars: env("readiness-interval"), Value: proxy.DefaultReadinessInterval,
			Usage: "How often the engine is probed (each probe may take this long); /readyz answers from the last result."},
		&cli.DurationFlag{Name: "shutdown-grace", EnvVars: env("shutdown-grace"), Value: proxy.DefaultShutdownGrace,
			Usage: "Longest time from SIGTERM to exit: requests in flight, streams included, get until then to finish. Keep it below the pod's terminationGracePeriodSeconds."},
		&cli.DurationFlag{Name: "drain-delay", EnvVars: env("drain-delay"), Value: proxy.DefaultDrainDelay,
			Usage: "How long after SIGTERM new connections are still accepted, with /readyz failing, while load balancers stop sending; part of the shutdown grace."},
		&cli.StringFlag{Name: "log-level", EnvVars: env("log-level"), Value: "info",
			Usage: "Log level: debug, info, warn or error. Logs are JSON on standard error."},
	}
}
