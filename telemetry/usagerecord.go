package telemetry

import (
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/timing-sidecar/timing-sidecar/timing"
)

// UsageRecords takes the usage records (usage.Records does): a request's
// start as it is forwarded, the record it gets if the sidecar's process
// ends first; its end when it is finished.
type UsageRecords interface {
	Start(id string, record []byte)
	End(id string, record []byte)
}

// UsageSchemaVersion is the data's schema_version: it changes when a
// member changes meaning or goes; members are only ever added within one.
const UsageSchemaVersion = 1

// Usage record ends: who ended the request.
const (
	EndCompleted   = "completed"    // the response reached its end, whatever its status
	EndClientGone  = "client_gone"  // the client left first
	EndEngineError = "engine_error" // the engine failed: no answer, or its body ended early or went silent
	EndShutdown    = "shutdown"     // the sidecar's shutdown grace ran out first
	EndLost        = "sidecar_lost" // the sidecar's process ended first (found at the next start)
)

// UsageEnvelope is the CloudEvents context each record carries.
type UsageEnvelope struct {
	// Type is the CloudEvents type (--usage-cloudevents-type).
	Type string
	// Source is the CloudEvents source (--usage-cloudevents-source).
	Source string
}

// UsageSubjectNone is the subject of a record whose request named no
// tenant: CloudEvents receivers that meter by subject (OpenMeter) need one.
const UsageSubjectNone = "unattributed"

// usageBuffers hold records being encoded.
var usageBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

// StartUsage gives a request forwarded to the engine its usage record's
// id and spools the record it gets if the process ends before it does.
// Without usage records it does nothing.
func (r *Recorder) StartUsage(req *Record, arrival time.Time) {
	if r.usage == nil {
		return
	}
	id, err := uuid.NewV7()
	if err != nil {
		id = uuid.New()
	}
	req.UsageID, req.Arrival = id.String(), arrival
	req.ID, req.Model, req.Tenant, req.Variant = clean(req.ID), clean(req.Model), clean(req.Tenant), clean(req.Variant)
	bp := usageBuffers.Get().(*[]byte)
	*bp = appendUsageRecord((*bp)[:0], &r.envelope, req, EndLost, time.Time{})
	r.usage.Start(req.UsageID, *bp)
	usageBuffers.Put(bp)
}

// endUsage spools a finished request's record.
func (r *Recorder) endUsage(req *Record, now time.Time) {
	bp := usageBuffers.Get().(*[]byte)
	*bp = appendUsageRecord((*bp)[:0], &r.envelope, req, usageEnd(req), now)
	r.usage.End(req.UsageID, *bp)
	usageBuffers.Put(bp)
}

// usageEnd is who ended a finished request.
func usageEnd(r *Record) string {
	switch {
	case r.CutAtShutdown:
		return EndShutdown
	case r.ClientGone:
		return EndClientGone
	case r.UpstreamError != "":
		return EndEngineError
	}
	return EndCompleted
}

// appendUsageRecord appends a request's usage record: a CloudEvent in
// JSON whose data is the schema telemetry/README.md's table gives. A
// lost request's record (end EndLost, the zero ended) has what was known
// as it was forwarded, and null for the rest.
func appendUsageRecord(b []byte, env *UsageEnvelope, r *Record, end string, ended time.Time) []byte {
	b = append(b, `{"specversion":"1.0","id":`...)
	b = appendString(b, r.UsageID)
	b = append(b, `,"source":`...)
	b = appendString(b, env.Source)
	b = append(b, `,"type":`...)
	b = appendString(b, env.Type)
	b = append(b, `,"subject":`...)
	if r.Tenant != "" {
		b = appendString(b, r.Tenant)
	} else {
		b = appendString(b, UsageSubjectNone)
	}
	b = append(b, `,"time":`...)
	b = appendTimestamp(b, r.Arrival)
	b = append(b, `,"datacontenttype":"application/json","data":{"schema_version":`...)
	b = strconv.AppendInt(b, UsageSchemaVersion, 10)
	b = append(b, `,"request_id":`...)
	b = appendString(b, r.ID)
	b = append(b, `,"tenant":`...)
	b = appendOptionalString(b, r.Tenant)
	b = append(b, `,"variant":`...)
	b = appendOptionalString(b, r.Variant)
	b = append(b, `,"model":`...)
	b = appendOptionalString(b, r.Model)
	b = append(b, `,"endpoint":`...)
	b = appendString(b, r.Endpoint)
	b = append(b, `,"leg":`...)
	b = appendString(b, legOf(r))
	b = append(b, `,"stream":`...)
	b = strconv.AppendBool(b, r.Stream)
	b = append(b, `,"end":`...)
	b = appendString(b, end)
	lost := end == EndLost
	b = append(b, `,"status":`...)
	if lost || r.Status == 0 {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(b, int64(r.Status), 10)
	}
	b = append(b, `,"upstream_error":`...)
	b = appendOptionalString(b, r.UpstreamError)
	var m timing.Metrics // all unknown, unless measured
	if r.Measured && !lost {
		m = r.Metrics
	}
	b = appendSourcedCount(b, `,"prompt_tokens":`, m.PromptTokens, timing.CountUsage)
	b = appendSourcedCount(b, `,"cached_tokens":`, cachedTokens(&m), timing.CountUsage)
	b = appendSourcedCount(b, `,"cache_write_tokens":`, m.CacheWriteTokens, timing.CountUsage)
	b = appendSourcedCount(b, `,"completion_tokens":`, m.Sent, m.SentFrom)
	b = appendSourcedCount(b, `,"reasoning_tokens":`, m.ReasoningTokens, timing.CountUsage)
	b = appendNumber(b, `,"time_to_first_token_ms":`, m.FirstTokenAfterArrival)
	b = appendNumber(b, `,"queue_time_ms":`, m.QueueTime)
	b = appendNumber(b, `,"mean_itl_ms":`, m.MeanITL)
	b = append(b, `,"duration_ms":`...)
	if lost || r.Elapsed <= 0 {
		b = append(b, "null"...)
	} else {
		b = appendMilli(b, float64(r.Elapsed)/float64(time.Millisecond))
	}
	b = append(b, `,"end_time":`...)
	b = appendTimestamp(b, ended)
	return append(b, "}}"...)
}

// appendSourcedCount appends a count and, under the key with _from, where
// it came from: from when set, unknown when not.
func appendSourcedCount(b []byte, key string, c timing.Count, from timing.CountSource) []byte {
	b = appendCount(b, key, c)
	b = append(b, key[:len(key)-2]...)
	b = append(b, `_from":"`...)
	if !c.Set {
		from = timing.CountUnknown
	}
	b = append(b, from.String()...)
	return append(b, '"')
}

// appendTimestamp appends t in RFC 3339 with nanoseconds, in UTC, or null
// for the zero time.
func appendTimestamp(b []byte, t time.Time) []byte {
	if t.IsZero() {
		return append(b, "null"...)
	}
	b = append(b, '"')
	b = t.UTC().AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

// appendOptionalString appends s, or null when it is empty.
func appendOptionalString(b []byte, s string) []byte {
	if s == "" {
		return append(b, "null"...)
	}
	return appendString(b, s)
}
