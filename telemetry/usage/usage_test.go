package usage

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	"go.opentelemetry.io/otel/sdk/resource"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"

	"github.com/timing-sidecar/timing-sidecar/telemetry/spool"
)

const event = `{"specversion":"1.0","id":"0193-a","source":"timing-sidecar/pod-1","type":"timing-sidecar.usage.v1","subject":"acme",` +
	`"time":"2026-12-05T01:02:03.456789Z","datacontenttype":"application/json","data":{"schema_version":1,"request_id":"r1",` +
	`"tenant":"acme","model":"llama","stream":true,"status":200,"prompt_tokens":7,"cached_tokens":null,"time_to_first_token_ms":80.5}}`

// logExporter keeps what it exports, failing while fail is set.
type logExporter struct {
	mu      sync.Mutex
	fail    bool
	records []sdklog.Record
}

func (e *logExporter) Export(_ context.Context, records []sdklog.Record) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.fail {
		return errors.New("collector down")
	}
	for _, r := range records {
		e.records = append(e.records, r.Clone())
	}
	return nil
}
func (e *logExporter) Shutdown(context.Context) error   { return nil }
func (e *logExporter) ForceFlush(context.Context) error { return nil }

// TestOTLPLogsCarryTheRecord: a record is a log record with the event's
// type as its name, its time, its context under the cloudevents.* names
// and each data member as an attribute; null members are absent.
func TestOTLPLogsCarryTheRecord(t *testing.T) {
	exp := &logExporter{}
	res := resource.NewSchemaless(semconv.ServiceName("timing-sidecar"))
	sink := NewOTLPLogs(exp, res)
	if err := sink.Send(context.Background(), []spool.Record{{ID: []byte("0193-a"), Data: []byte(event)}}); err != nil {
		t.Fatal(err)
	}
	if len(exp.records) != 1 {
		t.Fatalf("%d records", len(exp.records))
	}
	r := exp.records[0]
	if r.EventName() != "timing-sidecar.usage.v1" || !r.Timestamp().Equal(time.Date(2026, 12, 5, 1, 2, 3, 456789000, time.UTC)) {
		t.Errorf("event %q at %v", r.EventName(), r.Timestamp())
	}
	if name, _ := r.Resource().Set().Value(semconv.ServiceNameKey); name.AsString() != "timing-sidecar" {
		t.Errorf("resource %v", r.Resource())
	}
	got := map[string]attribute.Value{}
	r.WalkAttributes(func(kv attribute.KeyValue) bool {
		got[string(kv.Key)] = kv.Value
		return true
	})
	for k, want := range map[string]attribute.Value{
		"cloudevents.event_id": attribute.StringValue("0193-a"), "cloudevents.event_subject": attribute.StringValue("acme"),
		"cloudevents.event_type": attribute.StringValue("timing-sidecar.usage.v1"), "cloudevents.event_source": attribute.StringValue("timing-sidecar/pod-1"),
		"request_id": attribute.StringValue("r1"), "stream": attribute.BoolValue(true), "status": attribute.Int64Value(200),
		"prompt_tokens": attribute.Int64Value(7), "time_to_first_token_ms": attribute.Float64Value(80.5), "schema_version": attribute.Int64Value(1),
	} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v", k, got[k].String(), want.String())
		}
	}
	if _, ok := got["cached_tokens"]; ok {
		t.Error("a null member became an attribute")
	}
}

// TestDeliveryRetriesUntilAcknowledged: a sink that fails gets the same
// batch again after a backoff, and every record is counted once as
// delivered; closing with records left keeps them in the spool.
func TestDeliveryRetriesUntilAcknowledged(t *testing.T) {
	exp := &logExporter{fail: true}
	reg := prometheus.NewRegistry()
	quiet := slog.New(slog.DiscardHandler)
	dir := t.TempDir()
	r, err := Open(Options{Spool: spool.Options{Dir: dir, MaxSize: 1 << 20}, Sinks: []Sink{NewOTLPLogs(exp, nil)}, Log: quiet}, reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c"} {
		r.Start(id, []byte(event))
		r.End(id, []byte(event))
	}
	eventually(t, "a retry counted", func() bool { return counter(reg, "timing_sidecar_usage_records_retried_total") > 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	left := r.Close(ctx)
	cancel()
	if left[SinkOTLP] != 3 {
		t.Fatalf("left %v, want the 3 records", left)
	}
	// The next process delivers them.
	exp.mu.Lock()
	exp.fail = false
	exp.mu.Unlock()
	reg = prometheus.NewRegistry()
	r, err = Open(Options{Spool: spool.Options{Dir: dir, MaxSize: 1 << 20}, Sinks: []Sink{NewOTLPLogs(exp, nil)}, Log: quiet}, reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if left := r.Close(ctx); len(left) != 0 {
		t.Fatalf("left %v after a drain", left)
	}
	if len(exp.records) != 3 {
		t.Errorf("%d records delivered, want 3", len(exp.records))
	}
}
