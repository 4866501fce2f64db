package usage

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	"go.opentelemetry.io/otel/sdk/resource"

	"github.com/timing-sidecar/timing-sidecar/telemetry/spool"
)

// Defaults of the settings.
const (
	DefaultSpoolMaxSize = spool.DefaultMaxSize
	DefaultSpoolSync    = spool.DefaultSync
	DefaultTimeout      = 10 * time.Second
	DefaultEventType    = "timing-sidecar.usage.v1"
	// minSpoolSize: room for a few segments.
	minSpoolSize = 1 << 20
)

// Config says whether and where the usage records go (see
// telemetry/README.md): to the CloudEvents endpoint and to OTLP logs,
// whichever are set, through the spool in SpoolDir. A spool with no sink
// is off: the manifests give every sidecar its spool, and naming a sink
// turns the records on.
type Config struct {
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

// DefaultConfig is the settings' defaults: records off.
func DefaultConfig() Config {
	return Config{SpoolMaxSize: DefaultSpoolMaxSize, SpoolSync: DefaultSpoolSync, Timeout: DefaultTimeout, EventType: DefaultEventType}
}

// Problems checks the settings; logs says an OTLP endpoint for logs was
// named, which is a sink.
func (c *Config) Problems(logs bool) []error {
	var errs []error
	if c.SpoolDir == "" {
		if c.CloudEventsURL != "" || logs {
			errs = append(errs, errors.New("usage records (a CloudEvents endpoint or an OTLP logs endpoint) need a spool: set --usage-spool-dir"))
		}
		return errs
	}
	if c.CloudEventsURL != "" {
		if p, err := url.Parse(c.CloudEventsURL); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			errs = append(errs, fmt.Errorf("usage CloudEvents endpoint %q: want an http or https URL", c.CloudEventsURL))
		}
	}
	if _, err := ParseHeaders(c.CloudEventsHeaders); err != nil {
		errs = append(errs, err)
	}
	if c.SpoolMaxSize < minSpoolSize {
		errs = append(errs, fmt.Errorf("usage spool max size %d: want at least %d bytes", c.SpoolMaxSize, minSpoolSize))
	}
	if c.Timeout <= 0 || c.SpoolSync <= 0 {
		errs = append(errs, fmt.Errorf("usage timeout %v and spool sync %v: want positive", c.Timeout, c.SpoolSync))
	}
	if c.EventType == "" {
		errs = append(errs, errors.New("usage CloudEvents type is empty"))
	}
	return errs
}

// On tells whether the settings make records: a spool and a sink, logs
// saying an OTLP logs endpoint is one.
func (c *Config) On(logs bool) bool {
	return c.SpoolDir != "" && (c.CloudEventsURL != "" || logs)
}

// OpenConfig opens the records the settings ask for, with logs, when not
// nil, as the OTLP logs sink's exporter (its records of resource res).
func OpenConfig(c Config, logs sdklog.Exporter, res *resource.Resource, log *slog.Logger, reg prometheus.Registerer) (*Records, error) {
	var sinks []Sink
	if c.CloudEventsURL != "" {
		ce, err := NewCloudEvents(c.CloudEventsURL, c.CloudEventsHeaders, c.Timeout)
		if err != nil {
			return nil, err
		}
		sinks = append(sinks, ce)
	}
	if logs != nil {
		sinks = append(sinks, NewOTLPLogs(logs, res))
	}
	return Open(Options{Spool: spool.Options{Dir: c.SpoolDir, MaxSize: c.SpoolMaxSize, Sync: c.SpoolSync}, Sinks: sinks, Log: log}, reg)
}
