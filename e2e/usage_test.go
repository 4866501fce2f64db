package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tidwall/gjson"
	"mvdan.cc/sh/v3/syntax"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
)

// Usage records end to end: the release binary's records reach a
// CloudEvents receiver that fails in each way a receiver fails, and a real
// OpenTelemetry Collector as OTLP log records, through a SIGKILL, a
// restart on the same spool, a shutdown that cuts streams, and a spool on
// a filesystem that fills. Each request has its own X-Request-Id, which
// its record carries as data.request_id.

// usageRequests is the main run's mixed traffic; -short sends a tenth.
const usageRequests = 10_000

// usageWorkers is the main run's clients at once.
const usageWorkers = 32

// usageTimeout is the sidecar's --usage-cloudevents-timeout: short, so
// that a receiver that hangs costs the run little.
const usageTimeout = 300 * time.Millisecond

// usageTenant is the tenant header the sidecar reads; its value becomes
// the record's subject and data.tenant.
const usageTenant = "X-Tenant"

// The sinks, as the "sink" label says them.
const (
	sinkCloudEvents = "cloudevents"
	sinkOTLP        = "otlp"
)

// ceFault is what the CloudEvents receiver does with one batch.
type ceFault int

const (
	ceAccept  ceFault = iota // acknowledges it (202)
	ceFail                   // answers 500
	ceHang                   // never answers: the sidecar gives up at its timeout
	ceHangUp                 // closes the connection without an answer
	ceSlow                   // acknowledges it after a third of the sidecar's timeout
	ceLate                   // takes it, and acknowledges it once the sidecar has given up: it comes again
	ceRestart                // closes its listener and connections, then serves again on the same address
)

var ceFaultNames = map[ceFault]string{ceAccept: "accept", ceFail: "500", ceHang: "hang", ceHangUp: "hang up", ceSlow: "slow",
	ceLate: "late", ceRestart: "restart"}

// ceReceiver is a CloudEvents batch endpoint written for faults: each
// batch gets what schedule says for its number (from 0), and every copy
// of every record it acknowledged is kept, as sent, by CloudEvent id.
type ceReceiver struct {
	addr     string // host:port, the same across restarts
	schedule func(batch int) ceFault

	restarting sync.Mutex // one restart at a time
	mu         sync.Mutex
	srv        *http.Server
	closed     bool
	batches    int
	faults     map[ceFault]int
	copies     map[string][]string
	// unexpected are batches not as the sink must send them.
	unexpected []string
	// slowest is the longest a batch it acknowledged took, from its
	// headers to the answer.
	slowest time.Duration
}

func newCEReceiver(t *testing.T, schedule func(batch int) ceFault) *ceReceiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &ceReceiver{addr: ln.Addr().String(), schedule: schedule, faults: map[ceFault]int{}, copies: map[string][]string{}}
	r.serve(ln)
	t.Cleanup(func() {
		r.restarting.Lock() // a restart under way serves again first
		defer r.restarting.Unlock()
		r.mu.Lock()
		r.closed = true
		srv := r.srv
		r.mu.Unlock()
		srv.Close()
	})
	return r
}

func (r *ceReceiver) url() string { return "http://" + r.addr + "/api/v1/events" }

func (r *ceReceiver) serve(ln net.Listener) {
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	r.mu.Lock()
	r.srv = srv
	r.mu.Unlock()
	go srv.Serve(ln) //nolint:errcheck // ends with Close
}

// restart closes the listener and every connection, then listens again
// on the same address: the sidecar meets a refused connection or two.
func (r *ceReceiver) restart() {
	r.restarting.Lock()
	defer r.restarting.Unlock()
	r.mu.Lock()
	old, closed := r.srv, r.closed
	r.mu.Unlock()
	if closed {
		return
	}
	old.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ln, err := net.Listen("tcp", r.addr)
		if err == nil {
			r.serve(ln)
			return
		}
		if time.Now().After(deadline) {
			r.note(fmt.Sprintf("listen again on %s: %v", r.addr, err))
			return
		}
		time.Sleep(10 * time.Millisecond) // the port is briefly someone's: retry the bind
	}
}

func (r *ceReceiver) note(problem string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.unexpected) < 10 {
		r.unexpected = append(r.unexpected, problem)
	}
}

func (r *ceReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	arrived := time.Now()
	body, err := io.ReadAll(req.Body)
	r.mu.Lock()
	n := r.batches
	r.batches++
	fault := r.schedule(n)
	r.faults[fault]++
	r.mu.Unlock()
	if err != nil {
		return // the sender left mid-batch
	}
	switch fault {
	case ceFail:
		w.WriteHeader(http.StatusInternalServerError)
		return
	case ceHang:
		<-req.Context().Done() // the sender's timeout, or a restart, ends it
		return
	case ceHangUp:
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
		return
	case ceRestart:
		r.restart()
		return
	case ceSlow:
		// The fault itself: a receiver that takes its time, within the
		// sender's timeout.
		time.Sleep(usageTimeout / 3)
	}
	if req.Method != http.MethodPost || req.Header.Get("Content-Type") != "application/cloudevents-batch+json" ||
		req.Header.Get("Authorization") != "Bearer e2e-token" {
		r.note(fmt.Sprintf("%s with Content-Type %q, Authorization %q", req.Method, req.Header.Get("Content-Type"), req.Header.Get("Authorization")))
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	// gjson, not encoding/json: a batch of a megabyte is read well within
	// the sender's timeout even in a test built with -race.
	batch := gjson.ParseBytes(body)
	if !gjson.ValidBytes(body) || !batch.IsArray() || len(batch.Array()) == 0 {
		r.note(fmt.Sprintf("a batch that is no array of events: %.200s", body))
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	var ids, events []string
	for _, e := range batch.Array() {
		id := e.Get("id")
		if id.Type != gjson.String || id.Str == "" {
			r.note(fmt.Sprintf("an event without an id: %.200s", e.Raw))
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		ids, events = append(ids, id.Str), append(events, e.Raw)
	}
	r.mu.Lock()
	for i, e := range events {
		r.copies[ids[i]] = append(r.copies[ids[i]], e)
	}
	if fault != ceLate {
		r.slowest = max(r.slowest, time.Since(arrived))
	}
	r.mu.Unlock()
	if fault == ceLate {
		<-req.Context().Done() // the sender's timeout
	}
	w.WriteHeader(http.StatusAccepted)
}

// usageEvent is a usage record's CloudEvent; numbers in data are
// json.Number, nulls nil.
type usageEvent struct {
	ID              string         `json:"id"`
	Source          string         `json:"source"`
	Type            string         `json:"type"`
	Subject         string         `json:"subject"`
	Time            string         `json:"time"`
	SpecVersion     string         `json:"specversion"`
	DataContentType string         `json:"datacontenttype"`
	Data            map[string]any `json:"data"`
}

func (e usageEvent) requestID() string { s, _ := e.Data["request_id"].(string); return s }

// records returns the records acknowledged so far by request id, each
// decoded from its first copy, and says of every id whose copies differ in
// a byte, and of every request with two records.
func (r *ceReceiver) records() (map[string]usageEvent, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]usageEvent{}
	var problems []string
	for id, copies := range r.copies {
		for _, c := range copies[1:] {
			if c != copies[0] {
				problems = append(problems, fmt.Sprintf("CloudEvent %s delivered twice with different bytes:\n%s\n%s", id, copies[0], c))
			}
		}
		var e usageEvent
		d := json.NewDecoder(strings.NewReader(copies[0]))
		d.UseNumber()
		if err := d.Decode(&e); err != nil || e.ID != id {
			problems = append(problems, fmt.Sprintf("CloudEvent %s: %v: %s", id, err, copies[0]))
			continue
		}
		if old, ok := out[e.requestID()]; ok {
			problems = append(problems, fmt.Sprintf("request %s has two records, %s and %s", e.requestID(), old.ID, e.ID))
		}
		out[e.requestID()] = e
	}
	return out, problems
}

// duplicates is how many copies past the first the receiver acknowledged.
func (r *ceReceiver) duplicates() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.copies {
		n += len(c) - 1
	}
	return n
}

// otlpUsage reads the usage records the collector wrote, by request id,
// and says of every CloudEvent id whose copies differ in an attribute,
// and of every request with two records.
func otlpUsage(t *testing.T, c *collector) (map[string]otlpLogRecord, int, []string) {
	t.Helper()
	byEvent := map[string]otlpLogRecord{}
	out := map[string]otlpLogRecord{}
	var problems []string
	duplicates := 0
	for _, r := range c.logRecords(t) {
		id, _ := r.Attributes["cloudevents.event_id"].(string)
		if first, ok := byEvent[id]; ok {
			duplicates++
			if fmt.Sprint(first.Attributes) != fmt.Sprint(r.Attributes) { // fmt prints maps sorted by key
				problems = append(problems, fmt.Sprintf("log record %s delivered twice with different attributes:\n%v\n%v", id, first.Attributes, r.Attributes))
			}
			continue
		}
		byEvent[id] = r
		req, _ := r.Attributes["request_id"].(string)
		if old, ok := out[req]; ok {
			problems = append(problems, fmt.Sprintf("request %s has two log records, %v and %s", req, old.Attributes["cloudevents.event_id"], id))
		}
		out[req] = r
	}
	return out, duplicates, problems
}

// checkSameRecord checks that a log record is the CloudEvent e: its
// context attributes under OpenTelemetry's cloudevents.* names, each
// member of its data an attribute of the same name and value, none for a
// null, and nothing else.
func checkSameRecord(rep *reporter, e usageEvent, r otlpLogRecord) {
	rep.t.Helper()
	want := map[string]any{"cloudevents.event_id": e.ID, "cloudevents.event_source": e.Source,
		"cloudevents.event_spec_version": e.SpecVersion, "cloudevents.event_type": e.Type, "cloudevents.event_subject": e.Subject}
	for k, v := range e.Data {
		if v != nil {
			want[k] = v
		}
	}
	for k, v := range want {
		got, ok := r.Attributes[k]
		if !ok || !sameValue(v, got) {
			rep.errorf("request %s: log record attribute %s = %v (present %v), the CloudEvent has %v", e.requestID(), k, got, ok, v)
		}
	}
	if len(r.Attributes) != len(want) {
		rep.errorf("request %s: log record has %d attributes, the CloudEvent %d values: %v", e.requestID(), len(r.Attributes), len(want), r.Attributes)
	}
	if at, err := time.Parse(time.RFC3339Nano, e.Time); err != nil || r.Time != at.UnixNano() || r.EventName != e.Type ||
		r.Severity != severityInfo || r.Resource["service.name"] != "timing-sidecar" {
		rep.errorf("request %s: log record at %d named %q, severity %d, resource %v; the CloudEvent at %s of type %q",
			e.requestID(), r.Time, r.EventName, r.Severity, r.Resource, e.Time, e.Type)
	}
}

// severityInfo is OTLP's INFO severity number: a usage record is no
// warning.
const severityInfo = 9

// reporter reports a run's problems, the first ten in full: a bug that
// every request meets would otherwise bury the log.
type reporter struct {
	t *testing.T
	n int
}

func (r *reporter) errorf(format string, args ...any) {
	r.t.Helper()
	if r.n++; r.n <= 10 {
		r.t.Errorf(format, args...)
	}
}

// done says how many problems there were past the ten.
func (r *reporter) done() {
	r.t.Helper()
	if r.n > 10 {
		r.t.Errorf("%d problems in all, the first ten above", r.n)
	}
}

// sameValue compares a JSON value with an OTLP attribute's.
func sameValue(j, a any) bool {
	n, ok := j.(json.Number)
	if !ok {
		return j == a
	}
	switch a := a.(type) {
	case int64:
		i, err := n.Int64()
		return err == nil && i == a
	case float64:
		f, err := n.Float64()
		return err == nil && f == a
	}
	return false
}

// usageSeries is the usage records' series on a sidecar's /metrics.
type usageSeries map[string]float64

// scrapeUsage reads the timing_sidecar_usage_* series, each by its name
// and sink, or its name alone when it has no sink; refusals summed over
// their reasons, and also by reason ("refused_total/write_failed").
func scrapeUsage(t *testing.T, admin string) usageSeries {
	t.Helper()
	s := usageSeries{}
	for name, mf := range scrapeFamilies(t, admin+"/metrics") {
		short, ok := strings.CutPrefix(name, "timing_sidecar_usage_")
		if !ok {
			continue
		}
		short = strings.TrimPrefix(short, "records_")
		for _, m := range mf.GetMetric() {
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
			key := short
			for _, l := range m.GetLabel() {
				if l.GetName() == "sink" {
					key += "/" + l.GetValue()
				}
			}
			s[key] += v
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" {
					s[key+"/"+l.GetValue()] += v
				}
			}
		}
	}
	return s
}

// awaitQuiet polls a sidecar's /metrics until done holds (nil: at once),
// no sink has a record left in the spool, and two scrapes in a row agree
// (export is asynchronous by design, and a scrape gathers each series at
// its own moment), and returns the series then; want says what done
// waits for.
func awaitQuiet(t *testing.T, admin string, sinks []string, want string, done func(usageSeries) bool) usageSeries {
	t.Helper()
	var s, last usageSeries
	quiet := func() bool {
		last, s = s, scrapeUsage(t, admin)
		for _, sink := range sinks {
			if s["spooled/"+sink] != 0 {
				return false
			}
		}
		return (done == nil || done(s)) && maps.Equal(s, last)
	}
	// Longer than await's 20 s: a delivery backs off up to 30 s.
	if !awaitWithin(40*time.Second, quiet) {
		t.Fatalf("after 40s, want every sink's spool empty%s: %v", want, s)
	}
	return s
}

// waitLogging waits until done is closed or within passes, and reports
// whether it was closed; every 5 s it logs what progress says.
func waitLogging(t *testing.T, done <-chan struct{}, within time.Duration, progress func() string) bool {
	t.Helper()
	timeout := time.After(within)
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return true
		case <-tick.C:
			t.Log(progress())
		case <-timeout:
			return false
		}
	}
}

// awaitWithin polls until found returns true or d passes, as await does
// for 20 s.
func awaitWithin(d time.Duration, found func() bool) bool {
	deadline := time.Now().Add(d)
	for !found() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond) // polling, where there is no event to await
	}
	return true
}

// checkReconciled checks produced = delivered + spooled + refused per sink.
func checkReconciled(t *testing.T, who string, s usageSeries, sinks []string) {
	t.Helper()
	for _, sink := range sinks {
		p, d, sp, r := s["produced_total/"+sink], s["delivered_total/"+sink], s["spooled/"+sink], s["refused_total/"+sink]
		if p != d+sp+r {
			t.Errorf("%s, sink %s: produced %v != delivered %v + spooled %v + refused %v", who, sink, p, d, sp, r)
		}
	}
}

// kill ends the sidecar's process with SIGKILL, as the OOM killer or a
// node's failure does, and waits until it is gone.
func (s *sidecar) kill(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	err := s.wait(t, 10*time.Second)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the sidecar exited with %v, want killed", err)
	}
	// The kill was the test's: startSidecar's cleanup finds the process
	// gone, and has nothing to report.
	s.exitErr = nil
}

// usageKind is a kind of request the usage tests send, and how it ends.
type usageKind int

const (
	wholeStream       usageKind = iota // read to its end, usage asked for
	unary                              // not streamed
	completionsStream                  // the completions API, read to its end, usage asked for
	engineRefuses                      // the engine answers 503
	clientLeaves                       // the client closes after k token events of a long stream
	clientLeavesPaced                  // the same, the engine pausing usagePace after each event
	engineCuts                         // the engine drops the connection after k token events
	openAtShutdown                     // a long stream open when the sidecar is told to stop
	openAtKill                         // a long stream open when the sidecar is killed
	heldOpen                           // a long stream its client leaves when the test says (usageRequest.leave)
)

var usageKindNames = []string{"whole stream", "unary", "completions stream", "engine refuses", "client leaves", "client leaves paced",
	"engine cuts", "open at shutdown", "open at kill", "held open"}

func (k usageKind) String() string { return usageKindNames[k] }

// usagePace is the engine's pause after each token event of a paced
// stream: far longer than the sidecar takes to see its client leave, so
// the sidecar reads no event the client did not get.
const usagePace = 1500 * time.Millisecond

// mixOf is the main run's request i: four in ten whole streams, three
// unary, one client leaving, one engine cutting, and the rest.
func mixOf(i int) (usageKind, int) {
	switch r := i % 100; {
	case r == 99:
		return clientLeavesPaced, 1 + (i/100)%3
	case r < 40:
		return wholeStream, 0
	case r < 70:
		return unary, 0
	case r < 80:
		return clientLeaves, 1 + i%4
	case r < 90:
		return engineCuts, 1 + i%4
	case r < 95:
		return engineRefuses, 0
	}
	return completionsStream, 0
}

// usageRequest is one request and what its client saw.
type usageRequest struct {
	id     string
	tenant string
	kind   usageKind
	k      int // clientLeaves*: token events read; engineCuts: sent before the cut

	sidecar    int // which sidecar the last attempt went to (1, 2, …)
	sent, end  time.Time
	status     int  // 0: no response
	events     int  // token events read
	done       bool // [DONE] read
	usageSeen  bool
	prompt     int64 // the usage the client got
	completion int64
	err        error
	// started is closed once the first token event is read (long streams).
	started chan struct{}
	// leave, closed, makes a heldOpen stream's client leave.
	leave chan struct{}
}

func newUsageRequest(id string, kind usageKind, k int) *usageRequest {
	return &usageRequest{id: id, tenant: "tenant-" + id[len(id)-1:], kind: kind, k: k, started: make(chan struct{}), leave: make(chan struct{})}
}

func (q *usageRequest) streamed() bool { return q.kind != unary && q.kind != engineRefuses }

// tokens is the max_tokens the request asks for.
func (q *usageRequest) tokens() int {
	switch q.kind {
	case clientLeaves, openAtShutdown, openAtKill:
		return 1000
	case clientLeavesPaced:
		return 10
	case heldOpen:
		return 4000
	}
	return 8
}

func (q *usageRequest) newHTTP(ctx context.Context, base string) *http.Request {
	path, body := "/v1/chat/completions", fmt.Sprintf(`{"model":"m","max_tokens":%d,"messages":[{"role":"user","content":"hi"}]`, q.tokens())
	switch q.kind {
	case wholeStream:
		body += `,"stream":true,"stream_options":{"include_usage":true}`
	case completionsStream:
		path, body = "/v1/completions", fmt.Sprintf(`{"model":"m","max_tokens":%d,"prompt":"hi","stream":true,"stream_options":{"include_usage":true}`, q.tokens())
	case unary, engineRefuses:
	default:
		body += `,"stream":true`
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+path, strings.NewReader(body+"}"))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", q.id)
	req.Header.Set(usageTenant, q.tenant)
	switch q.kind {
	case engineRefuses:
		req.Header.Set(emulator.HeaderStatus, "503")
	case clientLeaves:
		req.Header.Set(emulator.HeaderITL, "5ms")
	case clientLeavesPaced:
		req.Header.Set(emulator.HeaderITL, usagePace.String())
	case engineCuts:
		req.Header.Set(emulator.HeaderCutAfter, fmt.Sprint(q.k))
	case openAtShutdown, openAtKill, heldOpen:
		req.Header.Set(emulator.HeaderITL, "20ms")
	}
	return req
}

// attempt sends the request once to base and reads its answer as its kind
// says; the error is the request's or its body's.
func (q *usageRequest) attempt(client *http.Client, base string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if q.kind == heldOpen {
		go func() {
			select {
			case <-q.leave:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	q.status, q.events, q.done, q.usageSeen = 0, 0, false, false
	resp, err := client.Do(q.newHTTP(ctx, base))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	q.status = resp.StatusCode
	if !q.streamed() || resp.StatusCode != http.StatusOK {
		var body struct {
			Usage *struct {
				Prompt     int64 `json:"prompt_tokens"`
				Completion int64 `json:"completion_tokens"`
			} `json:"usage"`
		}
		b, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode == http.StatusOK {
			if err = json.Unmarshal(b, &body); err == nil && body.Usage != nil {
				q.usageSeen, q.prompt, q.completion = true, body.Usage.Prompt, body.Usage.Completion
			}
		}
		return err
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return err // io.EOF: the stream ended
		}
		data, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data:")
		if !ok {
			continue
		}
		data = strings.TrimSpace(data)
		if data == "[DONE]" {
			q.done = true
			continue
		}
		var ev struct {
			Choices []struct {
				Text  string `json:"text"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				Prompt     int64 `json:"prompt_tokens"`
				Completion int64 `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			return fmt.Errorf("event %q: %w", data, err)
		}
		if ev.Usage != nil {
			q.usageSeen, q.prompt, q.completion = true, ev.Usage.Prompt, ev.Usage.Completion
		}
		if len(ev.Choices) > 0 && (ev.Choices[0].Text != "" || ev.Choices[0].Delta.Content != "") {
			q.events++
			if q.events == 1 {
				close(q.started)
			}
			if (q.kind == clientLeaves || q.kind == clientLeavesPaced) && q.events == q.k {
				return nil // the client leaves: the deferred Close drops the connection
			}
		}
	}
}

// clientProblem says what is wrong with what the client saw, from its
// side alone; "" when the request ended as its kind does.
func (q *usageRequest) clientProblem() string {
	ended := q.err == nil || q.err == io.EOF
	switch {
	case q.kind == engineRefuses:
		if q.status == http.StatusServiceUnavailable && ended {
			return ""
		}
	case q.status != http.StatusOK:
	case q.kind == wholeStream || q.kind == completionsStream:
		if ended && q.done && q.usageSeen && q.completion == int64(q.tokens()) && q.events > 0 {
			return ""
		}
	case q.kind == unary:
		if ended && q.usageSeen && q.completion == int64(q.tokens()) {
			return ""
		}
	case q.kind == clientLeaves || q.kind == clientLeavesPaced:
		if q.err == nil && q.events == q.k {
			return ""
		}
	case q.kind == engineCuts:
		// What came, and no clean end.
		if !ended && q.events == q.k && !q.done {
			return ""
		}
	case q.kind == openAtShutdown || q.kind == openAtKill || q.kind == heldOpen:
		if !ended && q.events > 0 && !q.done {
			return ""
		}
	}
	return fmt.Sprintf("%s %s (k %d): status %d, %d token events, [DONE] %v, usage %v %d/%d, err %v",
		q.kind, q.id, q.k, q.status, q.events, q.done, q.usageSeen, q.prompt, q.completion, q.err)
}

// wantEnd is the record's end for a request that ran its course.
func (q *usageRequest) wantEnd() string {
	switch q.kind {
	case clientLeaves, clientLeavesPaced, heldOpen:
		return "client_gone"
	case engineCuts:
		return "engine_error"
	case openAtShutdown:
		return "shutdown"
	case openAtKill:
		return "sidecar_lost"
	}
	return "completed"
}

// checkRecord checks a request's record against what the client sent and
// saw; lostAllowed says the sidecar serving it may have died first.
func (q *usageRequest) checkRecord(rep *reporter, e usageEvent, lostAllowed bool) {
	rep.t.Helper()
	d := e.Data
	fail := func(format string, args ...any) {
		rep.t.Helper()
		rep.errorf("%s %s (k %d, sidecar %d, client: %d events, err %v): %s\n%v", q.kind, q.id, q.k, q.sidecar, q.events, q.err, fmt.Sprintf(format, args...), d)
	}
	endpoint := "chat_completions"
	if q.kind == completionsStream {
		endpoint = "completions"
	}
	if e.SpecVersion != "1.0" || e.Type != "timing-sidecar.usage.v1" || !strings.HasPrefix(e.Source, "timing-sidecar/") ||
		e.Subject != q.tenant || e.DataContentType != "application/json" || len(e.ID) != 36 {
		fail("envelope %+v", e)
	}
	if _, err := time.Parse(time.RFC3339Nano, e.Time); err != nil {
		fail("time %q: %v", e.Time, err)
	}
	if d["tenant"] != q.tenant || d["model"] != "m" || d["endpoint"] != endpoint || d["stream"] != q.streamed() || d["schema_version"] != json.Number("1") {
		fail("tenant, model, endpoint, stream or schema_version")
	}
	end, _ := d["end"].(string)
	if end == "sidecar_lost" && (lostAllowed || q.kind == openAtKill) {
		// What was known as it was forwarded, and null for the rest.
		for _, k := range []string{"status", "prompt_tokens", "completion_tokens", "duration_ms", "end_time", "time_to_first_token_ms"} {
			if d[k] != nil {
				fail("a lost request's %s is %v, want null", k, d[k])
			}
		}
		if d["completion_tokens_from"] != "unknown" || d["prompt_tokens_from"] != "unknown" {
			fail("a lost request's counts come from somewhere")
		}
		return
	}
	if end != q.wantEnd() {
		fail("end %q, want %q", end, q.wantEnd())
		return
	}
	if d["end_time"] == nil || d["duration_ms"] == nil {
		fail("no end_time or duration_ms")
	}
	status := json.Number("200")
	if q.kind == engineRefuses {
		status = "503"
	}
	if d["status"] != status {
		fail("status %v, want %v", d["status"], status)
	}
	completion, _ := d["completion_tokens"].(json.Number)
	c, _ := completion.Int64()
	from := d["completion_tokens_from"]
	switch q.kind {
	case wholeStream, completionsStream, unary:
		// The engine's usage: max_tokens, and what the client got when
		// it got that far.
		if from != "usage" || c != int64(q.tokens()) || d["prompt_tokens_from"] != "usage" || d["prompt_tokens"] == nil ||
			q.usageSeen && (c != q.completion || d["prompt_tokens"] != json.Number(fmt.Sprint(q.prompt))) {
			fail("counts, want the engine's usage: %d completion tokens (the client got %v: %d prompt, %d completion)", q.tokens(), q.usageSeen, q.prompt, q.completion)
		}
	case engineRefuses:
		if d["completion_tokens"] != nil || from != "unknown" {
			fail("completion tokens of a refusal")
		}
	case clientLeavesPaced, engineCuts:
		// Exactly what the engine sent before the end: what the client
		// got (paced: the sidecar saw the client leave before the next).
		if from != "counted" || completion == "" || c != int64(q.k) {
			fail("completion_tokens %v from %v, want %d counted", d["completion_tokens"], from, q.k)
		}
		if q.kind == engineCuts && d["upstream_error"] == nil {
			fail("no upstream_error")
		}
	case clientLeaves, openAtShutdown, heldOpen:
		// The sidecar may have read ahead of its client.
		if from != "counted" || completion == "" || c < int64(q.events) || c > int64(q.tokens()) {
			fail("completion_tokens %v from %v, want between %d and %d, counted", d["completion_tokens"], from, q.events, q.tokens())
		}
	}
}

// traffic sends requests to the sidecar serving now; a request that
// cannot have reached a dead one goes to the next.
type traffic struct {
	client *http.Client

	mu      sync.Mutex
	base    string
	gen     int
	dead    time.Time     // when the sidecar gen was known dead; zero while it lives
	changed chan struct{} // closed when the next one serves
}

func (tr *traffic) target() (string, int, time.Time, chan struct{}) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.base, tr.gen, tr.dead, tr.changed
}

// died says the serving sidecar's process is gone.
func (tr *traffic) died() {
	tr.mu.Lock()
	tr.dead = time.Now()
	tr.mu.Unlock()
}

// serve points the requests at the next sidecar.
func (tr *traffic) serve(base string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.base, tr.dead = base, time.Time{}
	tr.gen++
	close(tr.changed)
	tr.changed = make(chan struct{})
}

// run sends q until it reaches a live sidecar. An attempt that got no
// answer is sent again only when it cannot have reached the sidecar: its
// connection was refused, or it began after that process was gone.
func (tr *traffic) run(q *usageRequest) {
	for {
		base, gen, dead, changed := tr.target()
		q.sidecar, q.sent = gen, time.Now()
		q.err = q.attempt(tr.client, base)
		q.end = time.Now()
		if q.status != 0 || q.err == nil {
			return
		}
		if !errors.Is(q.err, syscall.ECONNREFUSED) && (dead.IsZero() || q.sent.Before(dead)) {
			return // it may have reached the sidecar, and died with it
		}
		select {
		case <-changed:
		case <-time.After(30 * time.Second):
			return
		}
	}
}

// TestUsageRecordsThroughFaultsAKillAndAShutdown sends 10,000 requests of
// every kind through the release binary, to a CloudEvents receiver that
// fails about one batch in two, in each of its ways, and to a real collector over
// OTLP/gRPC at once; kills the sidecar with SIGKILL in the middle of the
// traffic, with long streams open, and starts another on the same spool;
// then stops that one with streams open past its grace, and starts a
// third. Every request that reached a sidecar has one record at each sink,
// every copy the same, saying how the request ended and what it cost; the
// counters of each sidecar that lives reconcile.
func TestUsageRecordsThroughFaultsAKillAndAShutdown(t *testing.T) {
	n := usageRequests
	if testing.Short() {
		n /= 10
	}
	began := time.Now()
	engine := startEngine(t, emulator.Config{Timing: emulator.Timing{TTFT: 2 * time.Millisecond, ITL: time.Millisecond, OutputTokens: 8}})
	col := startCollector(t)
	// Each fault in turn, an acknowledged batch between most; every batch
	// fails while the receiver is down.
	cycle := []ceFault{ceAccept, ceFail, ceAccept, ceHang, ceAccept, ceHangUp, ceAccept, ceSlow, ceAccept, ceLate, ceAccept, ceRestart,
		ceAccept, ceFail, ceFail}
	var down atomic.Bool
	recv := newCEReceiver(t, func(b int) ceFault {
		if down.Load() {
			return ceFail
		}
		return cycle[b%len(cycle)]
	})
	sinks := []string{sinkCloudEvents, sinkOTLP}
	spool := t.TempDir()
	args := []string{"--upstream", engine.URL(), "--access-log=false", "--shutdown-grace", "1s", "--tenant-header", usageTenant,
		"--usage-spool-dir", spool, "--usage-cloudevents-endpoint", recv.url(),
		"--usage-cloudevents-header", "Authorization: Bearer e2e-token", "--usage-cloudevents-timeout", usageTimeout.String(),
		"--otlp-logs-endpoint", "http://" + col.grpc, "--otlp-logs-protocol", "grpc"}
	first := startSidecar(t, args)
	tr := &traffic{client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: usageWorkers, DisableCompression: true}},
		changed: make(chan struct{})}
	tr.serve(first.base)

	// The mix, from usageWorkers clients.
	reqs := make([]*usageRequest, n)
	var next, finished atomic.Int64
	var workers sync.WaitGroup
	aThird := make(chan struct{}) // closed once a third are answered
	for range usageWorkers {
		workers.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				kind, k := mixOf(i)
				q := newUsageRequest(fmt.Sprintf("mix-%05d", i), kind, k)
				reqs[i] = q
				tr.run(q)
				if finished.Add(1) == int64(n/3) {
					close(aThird)
				}
			}
		})
	}

	// A third of the way in, long streams open, then the kill.
	progress := func() string {
		return fmt.Sprintf("%d requests answered (%v)", finished.Load(), time.Since(began).Round(time.Millisecond))
	}
	if !waitLogging(t, aThird, time.Minute, progress) {
		t.Fatalf("after a minute, %s", progress())
	}
	pinned := make([]*usageRequest, 16)
	var streams sync.WaitGroup
	for i := range pinned {
		q := newUsageRequest(fmt.Sprintf("kill-%02d", i), openAtKill, 0)
		pinned[i] = q
		streams.Go(func() { tr.run(q) })
	}
	for _, q := range pinned {
		select {
		case <-q.started:
		case <-time.After(20 * time.Second):
			t.Fatalf("stream %s had no token event within 20s", q.id)
		}
	}
	killedAt := time.Now()
	first.kill(t)
	tr.died()
	t.Logf("killed the sidecar with %d requests answered and %d streams open (%v)", finished.Load(), len(pinned), time.Since(began).Round(time.Millisecond))
	// On a new port: the one freed may be an outgoing connection's by
	// now, and the clients follow.
	second := startSidecar(t, args)
	tr.serve(second.base)
	answered := make(chan struct{})
	go func() {
		workers.Wait()
		streams.Wait()
		close(answered)
	}()
	if !waitLogging(t, answered, 3*time.Minute, progress) {
		t.Fatalf("after 3 minutes, %s", progress())
	}
	t.Log(progress())

	// The second sidecar's quiet moment: it counts the records it found
	// and one for each request it served.
	servedBySecond := 0
	for _, q := range reqs {
		if q.sidecar == 2 {
			servedBySecond++
		}
	}
	atSecond := awaitQuiet(t, second.admin, sinks, fmt.Sprintf(", and produced − recovered = the %d requests it served", servedBySecond), func(s usageSeries) bool {
		for _, sink := range sinks {
			if s["produced_total/"+sink]-s["recovered_total/"+sink] != float64(servedBySecond) {
				return false
			}
		}
		return true
	})
	checkReconciled(t, "the restarted sidecar", atSecond, sinks)
	if atSecond["lost_total"] < float64(len(pinned)) || atSecond["retried_total/"+sinkCloudEvents] == 0 {
		t.Errorf("the restarted sidecar: %v lost (want at least the %d streams open at the kill), %v retried (want some)",
			atSecond["lost_total"], len(pinned), atSecond["retried_total/"+sinkCloudEvents])
	}
	for _, sink := range sinks {
		if atSecond["recovered_total/"+sink] < atSecond["lost_total"] {
			t.Errorf("the restarted sidecar recovered %v records for %s, fewer than the %v lost", atSecond["recovered_total/"+sink], sink, atSecond["lost_total"])
		}
	}
	t.Logf("the restarted sidecar is quiet (%v): %v", time.Since(began).Round(time.Millisecond), atSecond)

	// Streams open past the grace of a SIGTERM, the receiver down: their
	// records stay in the spool for the next sidecar.
	down.Store(true)
	shut := make([]*usageRequest, 8)
	for i := range shut {
		q := newUsageRequest(fmt.Sprintf("shutdown-%02d", i), openAtShutdown, 0)
		shut[i] = q
		streams.Go(func() { tr.run(q) })
	}
	for _, q := range shut {
		select {
		case <-q.started:
		case <-time.After(20 * time.Second):
			t.Fatalf("stream %s had no token event within 20s", q.id)
		}
	}
	second.cmd.Process.Signal(syscall.SIGTERM)
	if err := second.wait(t, 20*time.Second); err != nil {
		t.Fatalf("the second sidecar exited with %v after SIGTERM", err)
	}
	streams.Wait()
	logged := second.logLines(t)
	if !slices.ContainsFunc(logged, func(l string) bool { return contains(l, "shutdown grace over", `"streams_cut":8`) }) {
		t.Error("the second sidecar did not log that it cut the 8 streams at its grace")
	}
	if !slices.ContainsFunc(logged, func(l string) bool { return contains(l, "left in the spool", `"cloudevents":`) }) {
		t.Error("the second sidecar did not log the records it left in the spool for the receiver")
	}

	// A machine failure can lose a sink's position, which is not synced:
	// the third sidecar delivers again what the spool holds for it, the
	// same records, besides what the receiver never had; no request lost.
	if err := os.Remove(filepath.Join(spool, sinkOTLP+".cursor")); err != nil {
		t.Fatal(err)
	}
	down.Store(false)
	third := startSidecar(t, args)
	atThird := awaitQuiet(t, third.admin, sinks, "", nil)
	checkReconciled(t, "the third sidecar", atThird, sinks)
	for _, sink := range sinks {
		// The streams cut at the shutdown were the last records spooled,
		// in a segment the receiver's position still holds.
		if p := atThird["produced_total/"+sink]; p != atThird["recovered_total/"+sink] || p < float64(len(shut)) {
			t.Errorf("the third sidecar, which served nothing, produced %v records for %s and recovered %v; want at least the %d streams cut at the shutdown",
				p, sink, atThird["recovered_total/"+sink], len(shut))
		}
	}
	if atThird["lost_total"] != 0 {
		t.Errorf("the third sidecar found %v requests lost after a clean shutdown", atThird["lost_total"])
	}
	t.Logf("the third sidecar is quiet (%v): %v", time.Since(began).Round(time.Millisecond), atThird)

	// Every request, its record at each sink: the receiver has every one
	// the sidecars delivered; the collector's file follows.
	ce, problems := recv.records()
	var logs map[string]otlpLogRecord
	var logProblems []string
	var logDuplicates int
	if !await(func() bool {
		// Counted before they are read: reading them all takes seconds.
		if b, err := os.ReadFile(col.logs); err != nil || bytes.Count(b, []byte(`"cloudevents.event_id"`)) < len(ce) {
			return false
		}
		logs, logDuplicates, logProblems = otlpUsage(t, col)
		for id := range ce {
			if _, ok := logs[id]; !ok {
				return false
			}
		}
		return true
	}) {
		t.Errorf("after 20s the collector has %d of the %d records", len(logs), len(ce))
	}
	for _, p := range slices.Concat(problems, logProblems) {
		t.Error(p)
	}
	t.Logf("%d records read back from each sink (%v)", len(ce), time.Since(began).Round(time.Millisecond))
	all := slices.Concat(reqs, pinned, shut)
	checkUsageRun(t, engine, all, killedAt, ce, logs, atSecond["lost_total"])
	recv.mu.Lock()
	faults, unexpected, batches, slowest := maps.Clone(recv.faults), recv.unexpected, recv.batches, recv.slowest
	recv.mu.Unlock()
	for f, name := range ceFaultNames {
		if faults[f] == 0 {
			t.Errorf("the receiver never played %q in %d batches", name, batches)
		}
	}
	if len(unexpected) > 0 {
		t.Errorf("the receiver got batches not as the sink sends them: %q", unexpected)
	}
	// Every copy is compared with the first: there must be copies.
	if recv.duplicates() == 0 || logDuplicates == 0 {
		t.Errorf("%d records delivered twice to the receiver, %d to the collector: want some at each", recv.duplicates(), logDuplicates)
	}
	named := map[string]int{}
	for f, n := range faults {
		named[ceFaultNames[f]] = n
	}
	t.Logf("%d requests, %d records at each sink, duplicates: %d at the receiver over %d batches %v (the slowest acknowledged in %v), %d at the collector; in %v",
		len(all), len(ce), recv.duplicates(), batches, named, slowest.Round(time.Millisecond), logDuplicates, time.Since(began).Round(time.Millisecond))
}

// engineSaw tells whether the engine received request q.
func engineSaw(e *emulator.Server, q *usageRequest) bool {
	now, cancel := context.WithCancel(context.Background())
	cancel() // look, do not wait
	prefix := "chatcmpl-"
	if q.kind == completionsStream {
		prefix = "cmpl-"
	}
	return e.Started(now, prefix+q.id) == nil
}

// checkUsageRun checks each request, from its client's side unless the
// kill could have touched it (its sidecar died before it ended), and its
// records: one at each sink for every request that was answered or that
// the engine received (a request is forwarded after its start is
// spooled), none for a request never sent, the same record at both, and
// as many lost as the restarted sidecar counted.
func checkUsageRun(t *testing.T, engine *emulator.Server, all []*usageRequest, killedAt time.Time, ce map[string]usageEvent, logs map[string]otlpLogRecord, lostCounted float64) {
	t.Helper()
	rep := &reporter{t: t}
	defer rep.done()
	byID := map[string]*usageRequest{}
	kinds := map[usageKind]int{}
	unrecorded := 0
	for _, q := range all {
		byID[q.id] = q
		kinds[q.kind]++
		touched := q.sidecar == 1 && !q.end.Before(killedAt)
		if p := q.clientProblem(); p != "" && !touched {
			rep.errorf("client: %s", p)
		}
		if _, ok := ce[q.id]; !ok {
			unrecorded++
			if q.status != 0 || engineSaw(engine, q) {
				rep.errorf("%s %s (sidecar %d, status %d, err %v) was answered or reached the engine, and has no record", q.kind, q.id, q.sidecar, q.status, q.err)
			}
		}
	}
	lost := 0
	for id, e := range ce {
		q, ok := byID[id]
		if !ok {
			rep.errorf("a record of request %q, which was never sent: %v", id, e.Data)
			continue
		}
		// Only a sidecar that died can have left a request lost.
		q.checkRecord(rep, e, q.sidecar == 1)
		if e.Data["end"] == "sidecar_lost" {
			lost++
		}
		if l, ok := logs[id]; ok {
			checkSameRecord(rep, e, l)
		} else {
			rep.errorf("request %s has a CloudEvent and no log record", id)
		}
	}
	for id := range logs {
		if _, ok := ce[id]; !ok {
			rep.errorf("request %q has a log record and no CloudEvent", id)
		}
	}
	if float64(lost) != lostCounted {
		t.Errorf("%d records say sidecar_lost; the restarted sidecar counted %v lost", lost, lostCounted)
	}
	t.Logf("requests by kind %v; %d records lost to the kill; %d requests without a record, none answered nor seen by the engine", kinds, lost, unrecorded)
}

// shellQuote quotes s for sh, as the shell parser inject reads lines with
// writes them.
func shellQuote(t *testing.T, s string) string {
	t.Helper()
	q, err := syntax.Quote(s, syntax.LangPOSIX)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// tmpfsLauncher writes a program that runs the sidecar with dir a tmpfs of
// size bytes, mounted in a mount namespace of its own (unshare -m as root,
// else in a user namespace too): a volume that fills. The program execs
// its way to the sidecar, so its process is the sidecar's.
func tmpfsLauncher(t *testing.T, dir string, size int) string {
	t.Helper()
	mount := fmt.Sprintf(`mount -t tmpfs -o size=%d tmpfs "$1"`, size)
	flags := ""
	for _, f := range []string{"-m", "-rm"} {
		if out, err := exec.Command("unshare", f, "sh", "-c", mount, "sh", dir).CombinedOutput(); err == nil {
			flags = f
			break
		} else {
			t.Logf("unshare %s: %v: %s", f, err, out)
		}
	}
	if flags == "" {
		t.Fatal("cannot mount a tmpfs in a namespace of its own: unshare -m and unshare -rm both fail")
	}
	launcher := filepath.Join(t.TempDir(), "sidecar-on-tmpfs")
	script := fmt.Sprintf("#!/bin/sh\nexec unshare %s sh -c '%s && shift && exec \"$@\"' sh %s %s \"$@\"\n",
		flags, mount, shellQuote(t, dir), shellQuote(t, binary))
	if err := os.WriteFile(launcher, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return launcher
}

// startSidecarVia starts the sidecar as startSidecar does, through
// launcher, which is given the arguments and must exec the binary.
func startSidecarVia(t *testing.T, launcher string, args []string) *sidecar {
	t.Helper()
	release := binary
	binary = launcher
	defer func() { binary = release }()
	return startSidecar(t, args)
}

// TestUsageSpoolOnAFullFilesystem runs the sidecar with its spool on a
// 512 KiB tmpfs and --usage-spool-max-size far past it, the receiver
// refusing every batch, until the filesystem is full: every request is
// answered as without records; the records the filesystem refuses are
// counted and reported. Once the receiver accepts, everything spooled is
// delivered, the spool gives its room back and takes new records again,
// and the counters reconcile.
func TestUsageSpoolOnAFullFilesystem(t *testing.T) {
	engine := startEngine(t, emulator.Config{Timing: emulator.Timing{TTFT: 2 * time.Millisecond, ITL: time.Millisecond, OutputTokens: 8}})
	var accepting atomic.Bool
	recv := newCEReceiver(t, func(int) ceFault {
		if accepting.Load() {
			return ceAccept
		}
		return ceFail
	})
	dir := filepath.Join(t.TempDir(), "spool")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	sinks := []string{sinkCloudEvents}
	sc := startSidecarVia(t, tmpfsLauncher(t, dir, 512<<10), []string{"--upstream", engine.URL(), "--access-log=false",
		"--tenant-header", usageTenant, "--usage-spool-dir", dir, "--usage-spool-max-size", fmt.Sprint(64 << 20),
		"--usage-cloudevents-endpoint", recv.url(), "--usage-cloudevents-header", "Authorization: Bearer e2e-token",
		"--usage-cloudevents-timeout", usageTimeout.String()})

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8, DisableCompression: true}}
	byID := map[string]*usageRequest{}
	// send sends count requests, whole streams and unary ones, eight at a
	// time, and checks that each was answered as without records.
	send := func(prefix string, count int) []*usageRequest {
		t.Helper()
		batch := make([]*usageRequest, count)
		var next atomic.Int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for i := int(next.Add(1) - 1); i < count; i = int(next.Add(1) - 1) {
					kind := unary
					if i%2 == 0 {
						kind = wholeStream
					}
					q := newUsageRequest(fmt.Sprintf("%s-%04d", prefix, i), kind, 0)
					q.sidecar = 1
					q.err = q.attempt(client, sc.base)
					batch[i] = q
				}
			})
		}
		wg.Wait()
		rep := &reporter{t: t}
		for _, q := range batch {
			byID[q.id] = q
			if p := q.clientProblem(); p != "" {
				rep.errorf("not answered as without records: %s", p)
			}
		}
		rep.done()
		return batch
	}

	// Streams in flight from before the filesystem fills until after the
	// delivery: the spool holds their starts all along, and takes their
	// ends at the last.
	held := make([]*usageRequest, 4)
	var streams sync.WaitGroup
	for i := range held {
		q := newUsageRequest(fmt.Sprintf("held-%d", i), heldOpen, 0)
		q.sidecar = 1
		held[i] = q
		byID[q.id] = q
		streams.Go(func() { q.err = q.attempt(client, sc.base) })
	}
	for _, q := range held {
		select {
		case <-q.started:
		case <-time.After(20 * time.Second):
			t.Fatalf("stream %s had no token event within 20s", q.id)
		}
	}

	// Records until the filesystem refuses some, and more once it does.
	var s usageSeries
	for round := 0; s["refused_total/"+sinkCloudEvents+"/write_failed"] == 0; round++ {
		if round == 20 {
			t.Fatalf("no record refused after %d requests with the spool on a 512 KiB filesystem: %v", len(byID), s)
		}
		send(fmt.Sprintf("fill%02d", round), 100)
		s = scrapeUsage(t, sc.admin)
	}
	send("full", 100)
	full := scrapeUsage(t, sc.admin)
	t.Logf("the filesystem is full after %d requests: %v", len(byID), full)
	if full["refused_total/"+sinkCloudEvents+"/spool_full"] != 0 {
		t.Errorf("records refused as past --usage-spool-max-size, 64 MiB, with the spool on 512 KiB: %v", full)
	}
	if !await(func() bool {
		sc.mu.Lock()
		defer sc.mu.Unlock()
		return slices.ContainsFunc(sc.logs, func(l string) bool { return contains(l, "usage records refused", `"reason":"write_failed"`) })
	}) {
		t.Error("the operational log does not say that records were refused, write_failed")
	}

	// The receiver accepts: everything spooled is delivered.
	accepting.Store(true)
	delivered := awaitQuiet(t, sc.admin, sinks, "", nil)
	checkReconciled(t, "after the delivery", delivered, sinks)
	ce, problems := recv.records()
	for _, p := range problems {
		t.Error(p)
	}
	if want := delivered["produced_total/"+sinkCloudEvents] - delivered["refused_total/"+sinkCloudEvents]; float64(len(ce)) != want {
		t.Errorf("the receiver has %d records, want the %v spooled (produced %v − refused %v)",
			len(ce), want, delivered["produced_total/"+sinkCloudEvents], delivered["refused_total/"+sinkCloudEvents])
	}
	t.Logf("delivered: %v", delivered)

	// New records are taken again: the spool gave its room back.
	after := send("after", 100)
	for _, q := range held {
		close(q.leave)
	}
	streams.Wait()
	for _, q := range held {
		if p := q.clientProblem(); p != "" {
			t.Errorf("not answered as without records: %s", p)
		}
	}
	after = append(after, held...)
	atEnd := awaitQuiet(t, sc.admin, sinks, fmt.Sprintf(", and %d more produced", len(after)), func(s usageSeries) bool {
		return s["produced_total/"+sinkCloudEvents] == delivered["produced_total/"+sinkCloudEvents]+float64(len(after))
	})
	checkReconciled(t, "at the end", atEnd, sinks)
	if refused := atEnd["refused_total/"+sinkCloudEvents] - delivered["refused_total/"+sinkCloudEvents]; refused != 0 {
		t.Errorf("after every spooled record was delivered, %v of the %d records since were refused (spool %v bytes, was %v when full): "+
			"the spool gave no room back on the filesystem it filled", refused, len(after), atEnd["spool_bytes"], full["spool_bytes"])
	}
	ce, problems = recv.records()
	for _, p := range problems {
		t.Error(p)
	}
	var missing []string
	for _, q := range after {
		if _, ok := ce[q.id]; !ok {
			missing = append(missing, q.id)
		}
	}
	if len(missing) > 0 {
		t.Errorf("%d of the %d requests that ended once the spool had been delivered have no record, among them %v", len(missing), len(after), missing[:min(len(missing), 10)])
	}
	rep := &reporter{t: t}
	for id, e := range ce {
		if q, ok := byID[id]; !ok {
			rep.errorf("a record of request %q, which was never sent", id)
		} else {
			q.checkRecord(rep, e, false)
		}
	}
	rep.done()
	t.Logf("at the end: %v", atEnd)
}
