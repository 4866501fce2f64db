package usage

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/log"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	"go.opentelemetry.io/otel/sdk/resource"

	"github.com/timing-sidecar/timing-sidecar/telemetry/spool"
)

// Sink delivers batches of records, each a CloudEvent in JSON (structured
// mode), as the spool holds them. Send returns nil only once the receiver
// has acknowledged the whole batch.
type Sink interface {
	// Name is the sink's label value: SinkCloudEvents or SinkOTLP.
	Name() string
	Send(ctx context.Context, records []spool.Record) error
	// Close lets go of the sink's connections.
	Close(ctx context.Context) error
}

// The sinks' names, as the "sink" label says them.
const (
	SinkCloudEvents = "cloudevents"
	SinkOTLP        = "otlp"
)

// CloudEvents posts batches in the CloudEvents HTTP binding's batched
// mode (application/cloudevents-batch+json), OpenMeter's ingest shape:
// any 2xx acknowledges the batch; a 400, 413 or 422 rejects it (see
// delivery.deliver); anything else, or no answer within the timeout, is a
// failure the delivery retries.
type CloudEvents struct {
	URL     string
	Headers http.Header
	Client  *http.Client
}

// NewCloudEvents makes the sink; headers are "Name: value" lines (an
// Authorization header for OpenMeter's or Kong's token).
func NewCloudEvents(url string, headers []string, timeout time.Duration) (*CloudEvents, error) {
	h, err := ParseHeaders(headers)
	if err != nil {
		return nil, err
	}
	return &CloudEvents{URL: url, Headers: h, Client: &http.Client{Timeout: timeout}}, nil
}

// ParseHeaders reads "Name: value" lines.
func ParseHeaders(lines []string) (http.Header, error) {
	h := http.Header{}
	for _, line := range lines {
		name, value, ok := strings.Cut(line, ":")
		name = strings.TrimSpace(name)
		if !ok || name == "" || strings.ContainsAny(name, " \t") {
			return nil, fmt.Errorf("usage CloudEvents header %q: want \"Name: value\"", redactedHeader(line))
		}
		h.Add(name, strings.TrimSpace(value))
	}
	return h, nil
}

// redactedHeader is a header line fit for an error message: its name.
func redactedHeader(line string) string {
	name, _, _ := strings.Cut(line, ":")
	if len(name) > 40 {
		name = name[:40]
	}
	return name + ": …"
}

func (c *CloudEvents) Name() string { return SinkCloudEvents }

func (c *CloudEvents) Send(ctx context.Context, records []spool.Record) error {
	// A body of its own per batch: the transport may still read one
	// after the answer came.
	size := 2 + len(records)
	for _, r := range records {
		size += len(r.Data)
	}
	body := make([]byte, 0, size)
	body = append(body, '[')
	for i, r := range records {
		if i > 0 {
			body = append(body, ',')
		}
		body = append(body, r.Data...)
	}
	body = append(body, ']')
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	for name, values := range c.Headers {
		req.Header[name] = values
	}
	req.Header.Set("Content-Type", "application/cloudevents-batch+json")
	resp, err := c.Client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) //nolint:errcheck // the status is the answer
	switch {
	case resp.StatusCode/100 == 2:
	case resp.StatusCode == http.StatusBadRequest || resp.StatusCode == http.StatusRequestEntityTooLarge || resp.StatusCode == http.StatusUnprocessableEntity:
		// Malformed or too large: the delivery splits the batch.
		return &Rejected{Status: resp.Status, TooLarge: resp.StatusCode == http.StatusRequestEntityTooLarge}
	default:
		// 401 and 403 too: a token put right lets them through.
		return fmt.Errorf("CloudEvents receiver answered %s", resp.Status)
	}
	return nil
}

func (c *CloudEvents) Close(context.Context) error {
	c.Client.CloseIdleConnections()
	return nil
}

// OTLPLogs exports each record as an OpenTelemetry log record: the
// CloudEvent's type as the event name, its time as the timestamp, its
// context attributes under OpenTelemetry's cloudevents.* names, and each
// member of its data as an attribute of the same name.
type OTLPLogs struct {
	exporter sdklog.Exporter
	logger   log.Logger
	capture  *captureProcessor
}

// NewOTLPLogs makes the sink over an exporter, the records carrying res.
func NewOTLPLogs(exporter sdklog.Exporter, res *resource.Resource) *OTLPLogs {
	capture := &captureProcessor{}
	provider := sdklog.NewLoggerProvider(sdklog.WithResource(res), sdklog.WithProcessor(capture))
	return &OTLPLogs{exporter: exporter, capture: capture,
		logger: provider.Logger("github.com/timing-sidecar/timing-sidecar/telemetry/usage")}
}

func (o *OTLPLogs) Name() string { return SinkOTLP }

func (o *OTLPLogs) Send(ctx context.Context, records []spool.Record) error {
	o.capture.records = o.capture.records[:0]
	for _, r := range records {
		o.logger.Emit(ctx, logRecord(r.Data))
	}
	return otlpOutcome(o.exporter.Export(ctx, o.capture.records))
}

func (o *OTLPLogs) Close(ctx context.Context) error { return o.exporter.Shutdown(ctx) }

// logRecord is a CloudEvent as a log record.
func logRecord(event []byte) log.Record {
	var r log.Record
	ev := gjson.ParseBytes(event)
	r.SetEventName(ev.Get("type").String())
	if t, err := time.Parse(time.RFC3339Nano, ev.Get("time").String()); err == nil {
		r.SetTimestamp(t)
	}
	r.SetSeverity(log.SeverityInfo)
	for _, attr := range []struct{ key, name string }{
		{"id", "cloudevents.event_id"}, {"source", "cloudevents.event_source"},
		{"specversion", "cloudevents.event_spec_version"}, {"type", "cloudevents.event_type"},
		{"subject", "cloudevents.event_subject"},
	} {
		if v := ev.Get(attr.key); v.Exists() {
			r.AddAttributes(attribute.String(attr.name, v.String()))
		}
	}
	ev.Get("data").ForEach(func(k, v gjson.Result) bool {
		switch v.Type {
		case gjson.String:
			r.AddAttributes(attribute.String(k.String(), v.String()))
		case gjson.True, gjson.False:
			r.AddAttributes(attribute.Bool(k.String(), v.Bool()))
		case gjson.Number:
			if i := v.Int(); float64(i) == v.Float() && !strings.ContainsAny(v.Raw, ".eE") {
				r.AddAttributes(attribute.Int64(k.String(), i))
			} else {
				r.AddAttributes(attribute.Float64(k.String(), v.Float()))
			}
		}
		// null: the attribute is absent, as unknown.
		return true
	})
	return r
}

// captureProcessor keeps what the logger emits, for one synchronous
// export: the delivery, not a batch processor, owns the records' fate.
type captureProcessor struct{ records []sdklog.Record }

func (c *captureProcessor) OnEmit(_ context.Context, r *sdklog.Record) error {
	c.records = append(c.records, r.Clone())
	return nil
}

func (c *captureProcessor) Enabled(context.Context, sdklog.EnabledParameters) bool { return true }
func (c *captureProcessor) Shutdown(context.Context) error                         { return nil }
func (c *captureProcessor) ForceFlush(context.Context) error                       { return nil }
