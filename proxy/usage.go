package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	sdklog "go.opentelemetry.io/otel/sdk/log"

	"github.com/timing-sidecar/timing-sidecar/telemetry"
	"github.com/timing-sidecar/timing-sidecar/telemetry/usage"
)

// openUsage opens the usage records as cfg says, or returns nil when they
// are off, with the envelope each record goes in.
func openUsage(cfg *Config, otlp telemetry.OTLP, reg prometheus.Registerer, log *slog.Logger) (*usage.Records, telemetry.UsageEnvelope, error) {
	u := &cfg.Usage
	env := telemetry.UsageEnvelope{Type: u.EventType, Source: u.EventSource}
	logs := usageLogs(otlp.Logs)
	if !u.On(logs) {
		return nil, env, nil
	}
	if env.Source == "" {
		instance := cfg.OTLP.InstanceID
		if instance == "" {
			instance, _ = os.Hostname()
		}
		env.Source = "timing-sidecar/" + instance
	}
	var exporter sdklog.Exporter
	if logs {
		var err error
		if exporter, err = telemetry.NewLogExporter(otlp); err != nil {
			return nil, env, fmt.Errorf("OTLP logs: %w", err)
		}
	}
	records, err := usage.OpenConfig(*u, exporter, otlp.Resource, log, reg)
	if err != nil && exporter != nil {
		exporter.Shutdown(context.Background()) //nolint:errcheck // start-up failed already
	}
	return records, env, err
}

// usageSinks names where the usage records go, for the start-up log: none
// when they are off.
func (p *Proxy) usageSinks() []string {
	if p.usage == nil {
		return []string{}
	}
	return p.usage.Sinks()
}

// usageLogs tells whether the usage records go out as OTLP logs: only to
// an endpoint named for logs (--otlp-logs-endpoint or
// OTEL_EXPORTER_OTLP_LOGS_ENDPOINT). The shared OTEL_EXPORTER_OTLP_ENDPOINT,
// set for traces, does not turn billing records on, nor send them to a
// collector that may have no logs pipeline.
func usageLogs(logs telemetry.Signal) bool { return logs.On && logs.Own }
