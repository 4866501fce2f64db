package requests

import (
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/timing-sidecar/timing-sidecar/telemetry"
)

// Access says who may read the page.
type Access string

const (
	// AccessLoopback answers loopback peers only, as x/net/trace's
	// /debug/requests does by default: `kubectl port-forward` reaches
	// the pod's loopback, and nothing else on the pod's network does.
	AccessLoopback Access = "loopback"
	// AccessAny answers every peer the admin listener lets in.
	AccessAny Access = "any"
)

// Page is the JSON /debug/requests answers, and the HTML page draws.
type Page struct {
	Now     time.Time     `json:"now"`
	Running []RunningView `json:"running"`
	Recent  []EntryView   `json:"recent"`
	Slowest []EntryView   `json:"slowest"`
	// TraceURL is the link template of a trace id ({trace_id}).
	TraceURL string `json:"trace_url,omitempty"`
}

// RunningView is a running request: its time so far and the last mark it
// passed.
type RunningView struct {
	ID        string  `json:"id"`
	Endpoint  string  `json:"endpoint"`
	Model     string  `json:"model"`
	Tenant    string  `json:"tenant"`
	Variant   string  `json:"variant"`
	Arrival   string  `json:"arrival"`
	ElapsedMS float64 `json:"elapsed_ms"`
	Stage     string  `json:"stage"`
	// StageMS is when, after arrival, it passed the stage.
	StageMS float64 `json:"stage_ms"`
	Events  int     `json:"events"`
}

// EntryView is a finished request: what the access log says of it, its
// marks as offsets from arrival, and its stream's events.
type EntryView struct {
	ID            string          `json:"id"`
	Endpoint      string          `json:"endpoint"`
	Path          string          `json:"path"`
	Model         string          `json:"model"`
	Tenant        string          `json:"tenant"`
	Variant       string          `json:"variant"`
	Leg           string          `json:"leg"`
	Stream        bool            `json:"stream"`
	Status        int             `json:"status"`
	UpstreamError string          `json:"upstream_error"`
	ClientGone    bool            `json:"client_gone"`
	Cache         string          `json:"cache"`
	Arrival       string          `json:"arrival"`
	ElapsedMS     float64         `json:"elapsed_ms"`
	ClientStallMS float64         `json:"client_stall_ms"`
	Marks         Marks           `json:"marks"`
	Metrics       json.RawMessage `json:"metrics"`
	// CachedTokens and PrefillTokensPerSecond are the access log's
	// figures of the prompt cache and prefill speed, which the metrics
	// object does not carry; null where not known.
	CachedTokens           *int64     `json:"cached_tokens"`
	PrefillTokensPerSecond *float64   `json:"prefill_tokens_per_second"`
	Events                 EventsView `json:"events"`
	TraceID                string     `json:"trace_id,omitempty"`
}

// Marks are a request's clock marks in ms after its arrival; null where
// the request never passed the mark.
type Marks struct {
	Accepted   *float64 `json:"accepted_ms"`
	FirstToken *float64 `json:"first_token_ms"`
	LastToken  *float64 `json:"last_token_ms"`
	Done       *float64 `json:"done_ms"`
}

// EventsView is a stream's events: each kept event's arrival from the
// engine and write to the client, ms after the request's arrival, and
// the count and longest gap over all of them.
type EventsView struct {
	Count        int       `json:"count"`
	Arrived      []float64 `json:"arrived_ms"`
	Written      []float64 `json:"written_ms"`
	LongestGapMS float64   `json:"longest_gap_ms"`
	// LongestGapBefore is the index of the event after the longest gap.
	LongestGapBefore int `json:"longest_gap_before"`
}

// Filter is the page's query: each field set keeps only the requests
// that match it.
type Filter struct {
	ID, Tenant, Model, Variant, Cache, Leg string
	Status                                 int
}

// FilterOf reads a filter from the query: id, tenant, model, variant,
// status, cache and leg.
func FilterOf(q map[string][]string) Filter {
	get := func(k string) string {
		if v := q[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	status, _ := strconv.Atoi(get("status"))
	return Filter{ID: get("id"), Tenant: get("tenant"), Model: get("model"), Variant: get("variant"),
		Cache: get("cache"), Leg: get("leg"), Status: status}
}

func (f Filter) keeps(e *Entry) bool {
	for _, c := range []struct{ want, got string }{
		{f.ID, e.ID}, {f.Tenant, e.Tenant}, {f.Model, e.Model}, {f.Variant, e.Variant},
		{f.Cache, cacheOf(e)}, {f.Leg, legOf(e)},
	} {
		if c.want != "" && c.want != c.got {
			return false
		}
	}
	return f.Status == 0 || f.Status == e.Status
}

func (f Filter) keepsRunning(r RunningView) bool {
	for _, c := range []struct{ want, got string }{
		{f.ID, r.ID}, {f.Tenant, r.Tenant}, {f.Model, r.Model}, {f.Variant, r.Variant},
	} {
		if c.want != "" && c.want != c.got {
			return false
		}
	}
	return f.Status == 0 && f.Cache == "" && f.Leg == ""
}

func cacheOf(e *Entry) string {
	if !e.Measured {
		return ""
	}
	return e.Metrics.Cache.String()
}

func legOf(e *Entry) string {
	if e.Leg == "" {
		return telemetry.LegWhole
	}
	return e.Leg
}

// View is the page of what s holds now that filter keeps.
func (s *Store) View(now time.Time, filter Filter, traceURL string) Page {
	running, recent, slowest := s.Snapshot(now)
	p := Page{Now: now, TraceURL: traceURL, Running: []RunningView{}, Recent: []EntryView{}, Slowest: []EntryView{}}
	for _, r := range running {
		if filter.keepsRunning(r) {
			p.Running = append(p.Running, r)
		}
	}
	for _, side := range []struct {
		from []*Entry
		to   *[]EntryView
	}{{recent, &p.Recent}, {slowest, &p.Slowest}} {
		for _, e := range side.from {
			if filter.keeps(e) {
				*side.to = append(*side.to, entryView(e))
			}
		}
	}
	return p
}

var stageNames = [...]string{StageArrived: "arrived", StageAccepted: "accepted", StageTokens: "tokens", StageEnding: "ending"}

func runningView(r *Running, now time.Time) RunningView {
	stage, at, events := r.Progress()
	name := "arrived"
	if int(stage) < len(stageNames) {
		name = stageNames[stage]
	}
	return RunningView{ID: r.ID, Endpoint: r.Endpoint, Model: r.Model, Tenant: r.Tenant, Variant: r.Variant,
		Arrival: r.Arrival.UTC().Format(time.RFC3339Nano), ElapsedMS: ms(now.Sub(r.Arrival)),
		Stage: name, StageMS: ms(at.Sub(r.Arrival)), Events: events}
}

func entryView(e *Entry) EntryView {
	v := EntryView{ID: e.ID, Endpoint: e.Endpoint, Path: e.Path, Model: e.Model, Tenant: e.Tenant, Variant: e.Variant,
		Leg: legOf(e), Stream: e.Stream, Status: e.Status, UpstreamError: e.UpstreamError, ClientGone: e.ClientGone,
		Cache: cacheOf(e), Arrival: e.Clock.Arrival.UTC().Format(time.RFC3339Nano), ElapsedMS: ms(e.Elapsed),
		ClientStallMS: ms(e.ClientStall), TraceID: e.TraceID, Metrics: json.RawMessage("null")}
	mark := func(t time.Time) *float64 {
		if t.IsZero() {
			return nil
		}
		m := ms(t.Sub(e.Clock.Arrival))
		return &m
	}
	c := &e.Clock
	v.Marks = Marks{Accepted: mark(c.Accepted), FirstToken: mark(c.FirstToken), LastToken: mark(c.LastToken), Done: mark(c.Done)}
	if e.Measured {
		v.Metrics = e.Metrics.AppendJSON(nil)
		if c := e.Metrics.CachedTokens; c.Set {
			v.CachedTokens = &c.Value
		}
		if p := e.Metrics.PrefillTokensPerSecond; p.Set {
			v.PrefillTokensPerSecond = &p.Value
		}
	}
	t := &e.Timeline
	v.Events = EventsView{Count: t.Events, Arrived: micros(t.Arrived), Written: micros(t.Written),
		LongestGapMS: float64(t.LongestGap) / 1000, LongestGapBefore: t.LongestGapAt}
	return v
}

func micros(us []uint32) []float64 {
	out := make([]float64, len(us))
	for i, u := range us {
		out[i] = float64(u) / 1000
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Handler serves the page at /debug/requests: JSON when the query has
// format=json or the client accepts only application/json, else HTML
// (Render). access says which peers it answers; the others get 403.
func (s *Store) Handler(access Access, traceURL string, render func(*Page) []byte) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if access != AccessAny && !loopback(r.RemoteAddr) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			w.Write([]byte(`{"error":{"message":"timing-sidecar: /debug/requests answers loopback peers only (kubectl port-forward reaches it); --debug-requests=any opens it","type":"forbidden","code":"debug_requests_loopback_only"}}` + "\n"))
			return
		}
		page := s.View(time.Now(), FilterOf(r.URL.Query()), traceURL)
		if r.URL.Query().Get("format") == "json" || strings.HasPrefix(r.Header.Get("Accept"), "application/json") {
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(&page)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Write(render(&page))
	})
}

// loopback says the peer at addr (host:port) is on the loopback.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
