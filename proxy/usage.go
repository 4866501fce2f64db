package proxy

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/timing-sidecar/timing-sidecar/telemetry"
	"github.com/timing-sidecar/timing-sidecar/telemetry/spool"
	"github.com/timing-sidecar/timing-sidecar/telemetry/usage"
)

// Usage records' defaults.
const (
	DefaultUsageSpoolMaxSize = spool.DefaultMaxSize
	DefaultUsageSpoolSync    = spool.DefaultSync
	DefaultUsageTimeout      = 10 * time.Second
	DefaultUsageEventType    = "timing-sidecar.usage.v1"
	// minUsageSpoolSize: room for a few segments.
	minUsageSpoolSize = 1 << 20
)

// UsageConfig says whether and where the usage records go (see
// telemetry/README.md): to the CloudEvents endpoint and to OTLP logs
// (Config.OTLP.Logs), whichever are set, through the spool in SpoolDir. A
// spool with no sink is off: the manifests give every sidecar its spool,
// and naming a sink turns the records on.
type UsageConfig struct {
	// SpoolDir holds the records until every sink has them; it outlives
	// the process (an emptyDir outlives the container).
	SpoolDir string
	// SpoolMaxSize bounds the spool, in bytes; past it, records are
	// refused and counted.
	SpoolMaxSize int64
	// SpoolSync is how often new records are synced to the disk.
	SpoolSync time.Duration
	// CloudEventsURL, when set, receives the records as CloudEvents
	// batches; CloudEventsHeaders are "Name: value" lines sent with each
	// (a token).
	CloudEventsURL     string
	CloudEventsHeaders []string
	// EventType and EventSource are each record's CloudEvents type and
	// source; an empty source is "timing-sidecar/" and the instance id,
	// or the host's name.
	EventType, EventSource string
	// Timeout bounds one delivery to the CloudEvents endpoint.
	Timeout time.Duration
}

// usageProblems checks the usage settings against the resolved OTLP logs.
func (c *Config) usageProblems(logs telemetry.Signal) []error {
	u := &c.Usage
	var errs []error
	if u.SpoolDir == "" {
		if u.CloudEventsURL != "" || logs.Own {
			errs = append(errs, errors.New("usage records (a CloudEvents endpoint or an OTLP logs endpoint) need a spool: set --usage-spool-dir"))
		}
		return errs
	}
	if u.CloudEventsURL != "" {
		if p, err := url.Parse(u.CloudEventsURL); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			errs = append(errs, fmt.Errorf("usage CloudEvents endpoint %q: want an http or https URL", u.CloudEventsURL))
		}
	}
	if _, err := usage.ParseHeaders(u.CloudEventsHeaders); err != nil {
		errs = append(errs, err)
	}
	if u.SpoolMaxSize < minUsageSpoolSize {
		errs = append(errs, fmt.Errorf("usage spool max size %d: want at least %d bytes", u.SpoolMaxSize, minUsageSpoolSize))
	}
	if u.Timeout <= 0 || u.SpoolSync <= 0 {
		errs = append(errs, fmt.Errorf("usage timeout %v and spool sync %v: want positive", u.Timeout, u.SpoolSync))
	}
	if u.EventType == "" {
		errs = append(errs, errors.New("usage CloudEvents type is empty"))
	}
	return errs
}

// openUsage opens the usage records as cfg says, or returns nil when they
// are off.
func openUsage(cfg *Config, otlp telemetry.OTLP, reg prometheus.Registerer, log *slog.Logger) (*usage.Records, telemetry.UsageEnvelope, error) {
	u := &cfg.Usage
	env := telemetry.UsageEnvelope{Type: u.EventType, Source: u.EventSource}
	logs := usageLogs(otlp.Logs)
	if u.SpoolDir == "" || u.CloudEventsURL == "" && !logs {
		return nil, env, nil
	}
	if env.Source == "" {
		instance := cfg.OTLP.InstanceID
		if instance == "" {
			instance, _ = os.Hostname()
		}
		env.Source = "timing-sidecar/" + instance
	}
	var sinks []usage.Sink
	if u.CloudEventsURL != "" {
		ce, err := usage.NewCloudEvents(u.CloudEventsURL, u.CloudEventsHeaders, u.Timeout)
		if err != nil {
			return nil, env, err
		}
		sinks = append(sinks, ce)
	}
	if logs {
		exp, err := telemetry.NewLogExporter(otlp)
		if err != nil {
			return nil, env, fmt.Errorf("OTLP logs: %w", err)
		}
		sinks = append(sinks, usage.NewOTLPLogs(exp, otlp.Resource))
	}
	records, err := usage.Open(usage.Options{Spool: spool.Options{Dir: u.SpoolDir, MaxSize: u.SpoolMaxSize, Sync: u.SpoolSync},
		Sinks: sinks, Log: log}, reg)
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
