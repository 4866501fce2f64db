// Command timing-sidecar is a reverse proxy for OpenAI-compatible LLM
// servers that measures each request and adds a metrics object to its
// response. This file only wires flags to the proxy package.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/timing-sidecar/timing-sidecar/proxy"
	"github.com/timing-sidecar/timing-sidecar/rewrite"
	"github.com/timing-sidecar/timing-sidecar/telemetry"
	"github.com/timing-sidecar/timing-sidecar/telemetry/usage"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newApp(os.Stdout, os.Stderr).RunContext(ctx, os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "timing-sidecar:", err)
		os.Exit(1)
	}
}

func newApp(stdout, stderr io.Writer) *cli.App {
	return &cli.App{
		Name:      "timing-sidecar",
		Version:   version,
		Usage:     "a reverse proxy for OpenAI-compatible LLM servers that adds per-request timing metrics to responses",
		Writer:    stdout,
		ErrWriter: stderr,
		Flags:     serveFlags(),
		Commands:  []*cli.Command{demoCommand(), emulateCommand(), benchCommand(), accuracyCommand(), injectCommand(), compareCommand()},
		Action: func(c *cli.Context) error {
			cfg := configFrom(c)
			cfg.OTLP.ServiceVersion = version
			log, err := newLogger(stderr, c.String("log-level"))
			if err != nil {
				return err
			}
			return proxy.Run(c.Context, cfg, log, stdout)
		},
	}
}

// configFrom turns flags into a proxy.Config; proxy.Run validates it.
func configFrom(c *cli.Context) proxy.Config {
	return proxy.Config{
		Listen:                 c.String("listen"),
		Upstream:               c.String("upstream"),
		UpstreamCAFile:         c.String("upstream-ca-file"),
		UpstreamServerName:     c.String("upstream-server-name"),
		TLSCertFile:            c.String("ssl-certfile"),
		TLSKeyFile:             c.String("ssl-keyfile"),
		TLSClientCAFile:        c.String("ssl-ca-certs"),
		TLSClientCerts:         c.Int("ssl-cert-reqs"),
		Mode:                   rewrite.Mode(c.String("per-request-metrics")),
		UpstreamConnectTimeout: c.Duration("upstream-connect-timeout"),
		UpstreamHeaderTimeout:  c.Duration("upstream-header-timeout"),
		UpstreamIdleTimeout:    c.Duration("upstream-idle-timeout"),
		UpstreamKeepAlive:      c.Duration("upstream-keepalive"),
		ClientReadTimeout:      c.Duration("client-read-timeout"),
		ClientIdleTimeout:      c.Duration("client-idle-timeout"),
		ClientWriteTimeout:     c.Duration("client-write-timeout"),
		MaxEventHold:           c.Duration("max-event-hold"),
		MaxRequestBodySize:     c.Int("max-request-body-size"),
		MaxBodyMemory:          c.Int("max-body-memory"),
		MaxRequestHeaderSize:   c.Int("max-request-header-size"),
		MaxResponseHeaderSize:  c.Int("max-response-header-size"),
		MaxBufferedResponse:    c.Int("max-buffered-response-size"),
		MaxEventSize:           c.Int("max-event-size"),
		AdminListen:            c.String("admin-listen"),
		AdminPprof:             c.Bool("admin-pprof"),
		DebugRequests:          c.String("debug-requests"),
		TraceURL:               c.String("trace-url"),
		AccessLog:              c.Bool("access-log"),
		KernelTimestamps:       c.Bool("kernel-timestamps"),
		InjectUsage:            c.Bool("inject-usage"),
		UpgradeNonStreaming:    c.Bool("upgrade-non-streaming"),
		ForwardIncludeMetrics:  c.Bool("forward-include-metrics"),
		ForceIncludeUsage:      c.Bool("force-include-usage"),
		MaxModelLabels:         c.Int("max-model-labels"),
		TenantHeader:           c.String("tenant-header"),
		DisaggregationLeg:      c.String("disaggregation-leg"),
		TenantLabel:            c.Bool("tenant-label"),
		MaxTenantLabels:        c.Int("max-tenant-labels"),
		Variant:                c.String("variant"),
		VariantHeader:          c.String("variant-header"),
		MaxVariantLabels:       c.Int("max-variant-labels"),
		ReadinessProbe:         c.String("readiness-probe"),
		ReadinessPath:          c.String("readiness-path"),
		ReadinessInterval:      c.Duration("readiness-interval"),
		ShutdownGrace:          c.Duration("shutdown-grace"),
		DrainDelay:             c.Duration("drain-delay"),
		SLOTTFT:                c.Duration("slo-ttft"),
		SLOITL:                 c.Duration("slo-itl"),
		SLOE2E:                 c.Duration("slo-e2e"),
		SLOTTFTHeader:          c.String("slo-ttft-header"),
		SLOITLHeader:           c.String("slo-itl-header"),
		CPURequest:             c.String("cpu-request"),
		Usage: usage.Config{
			SpoolDir:           c.String("usage-spool-dir"),
			SpoolMaxSize:       c.Int64("usage-spool-max-size"),
			SpoolSync:          c.Duration("usage-spool-sync"),
			CloudEventsURL:     c.String("usage-cloudevents-endpoint"),
			CloudEventsHeaders: c.StringSlice("usage-cloudevents-header"),
			EventType:          c.String("usage-cloudevents-type"),
			EventSource:        c.String("usage-cloudevents-source"),
			Timeout:            c.Duration("usage-cloudevents-timeout"),
		},
		OTLP: telemetry.OTLPConfig{
			Traces:   telemetry.SignalConfig{Endpoint: c.String("otlp-traces-endpoint"), Protocol: c.String("otlp-traces-protocol")},
			Metrics:  telemetry.SignalConfig{Endpoint: c.String("otlp-metrics-endpoint"), Protocol: c.String("otlp-metrics-protocol")},
			Logs:     telemetry.SignalConfig{Endpoint: c.String("otlp-logs-endpoint"), Protocol: c.String("otlp-logs-protocol")},
			Identity: telemetry.Identity{InstanceID: c.String("service-instance-id")},
		},
	}
}

func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})), nil
}

// env names a flag's environment variable: TIMING_SIDECAR_<FLAG_IN_CAPS>.
func env(flag string) []string {
	return []string{"TIMING_SIDECAR_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))}
}
