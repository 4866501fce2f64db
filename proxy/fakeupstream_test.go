package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"
)

// fakeEngine is an in-process OpenAI-compatible upstream whose timing is set
// per request with headers, and which records the truth the sidecar's
// numbers are checked against. It stays beside the emulated engine
// (e2e/emulator), which these tests use too, for what a product emulator
// should not do: record every event's send time and every byte it wrote,
// send hop-by-hop headers and verbatim bodies, and answer with shapes a
// test names exactly (no finish event, an error status with any body).
// The emulator is vLLM as users meet it; this is a test instrument.
//
//	X-Fake-Header-Delay  ms before response headers
//	X-Fake-TTFT          ms after headers before the first token (streams)
//	X-Fake-Late-Headers  send a stream's headers with its first token, in one write
//	X-Fake-Cached        report this many cached prompt tokens in usage
//	X-Fake-ITL           ms between token events
//	X-Fake-Tokens        token events to send (default 4)
//	X-Fake-Per-Event     tokens per event (default 1)
//	X-Fake-Status        a status other than 200, with an OpenAI error body
//	X-Fake-Cut-After     close the connection after this many token events
//	X-Fake-Pause-After   after this many token events, wait for the client to leave
//	X-Fake-Body          send this body verbatim (non-streaming)
//	X-Fake-Server-Timing send each of these values as a Server-Timing field line
type fakeEngine struct {
	t   *testing.T
	srv *httptest.Server

	mu       sync.Mutex
	requests []*fakeRequest
	arrived  chan *fakeRequest
	newConns int
	closed   chan struct{} // one value per connection the engine saw close
}

// fakeRequest is one request the engine served and its timestamps. Every
// "sent" stamp is taken just before the bytes are written, so a mark the
// sidecar takes on them cannot come before it.
type fakeRequest struct {
	Method, URI string
	Header      http.Header
	Body        []byte
	Received    time.Time // the handler began, the body read
	HeadersSent time.Time
	FirstToken  time.Time
	LastToken   time.Time
	TokenSent   []time.Time   // each token event
	UsageSent   time.Time     // the usage event, if any
	Sent        bytes.Buffer  // every body byte written
	Finished    chan struct{} // closed when the handler returned
	Gone        chan struct{} // closed if the client went away first
	GoneAt      time.Time
}

// newFakeEngine starts an engine; configure may change its http.Server
// before it starts.
func newFakeEngine(t *testing.T, configure ...func(*http.Server)) *fakeEngine {
	f := &fakeEngine{t: t, arrived: make(chan *fakeRequest, 64), closed: make(chan struct{}, 64)}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	f.srv.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		switch state {
		case http.StateNew:
			f.mu.Lock()
			f.newConns++
			f.mu.Unlock()
		case http.StateClosed:
			select {
			case f.closed <- struct{}{}:
			default:
			}
		}
	}
	for _, c := range configure {
		c(f.srv.Config)
	}
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	return f
}

// connections is how many connections the engine has accepted.
func (f *fakeEngine) connections() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.newConns
}

func (f *fakeEngine) URL() string { return f.srv.URL }

// next returns the next request the engine received.
func (f *fakeEngine) next(t *testing.T) *fakeRequest {
	t.Helper()
	select {
	case r := <-f.arrived:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("the engine received no request")
		return nil
	}
}

func headerMillis(h http.Header, key string, def int) time.Duration {
	if v, err := strconv.Atoi(h.Get(key)); err == nil {
		return time.Duration(v) * time.Millisecond
	}
	return time.Duration(def) * time.Millisecond
}

func headerInt(h http.Header, key string, def int) int {
	if v, err := strconv.Atoi(h.Get(key)); err == nil {
		return v
	}
	return def
}

func (f *fakeEngine) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	fr := &fakeRequest{Method: r.Method, URI: r.RequestURI, Header: r.Header.Clone(), Body: body,
		Received: time.Now(), Finished: make(chan struct{}), Gone: make(chan struct{})}
	defer close(fr.Finished)
	go fr.watchClient(r.Context())
	f.mu.Lock()
	f.requests = append(f.requests, fr)
	f.mu.Unlock()
	f.arrived <- fr

	x := &fakeExchange{w: w, r: r, fr: fr}
	if !x.wait(headerMillis(r.Header, "X-Fake-Header-Delay", 0)) {
		return
	}
	x.setHeaders()
	if status := headerInt(r.Header, "X-Fake-Status", 200); status != 200 {
		x.fail(status)
		return
	}
	var req fakeBody
	json.Unmarshal(body, &req)
	plan := fakePlan{
		events:   headerInt(r.Header, "X-Fake-Tokens", 4),
		perEvent: headerInt(r.Header, "X-Fake-Per-Event", 1),
		ttft:     headerMillis(r.Header, "X-Fake-TTFT", 0),
		itl:      headerMillis(r.Header, "X-Fake-ITL", 0),
		cut:      headerInt(r.Header, "X-Fake-Cut-After", -1),
		pause:    headerInt(r.Header, "X-Fake-Pause-After", -1),
		cached:   headerInt(r.Header, "X-Fake-Cached", -1),
	}
	if !req.Stream {
		x.answer(plan)
		return
	}
	x.stream(plan, r.URL.Path == "/v1/chat/completions", req.wantsUsage())
}

// watchClient records the client's leaving before the handler returned:
// it closes Gone, stamped GoneAt, if ctx ends first.
func (fr *fakeRequest) watchClient(ctx context.Context) {
	select {
	case <-ctx.Done():
		select {
		case <-fr.Finished: // the context ends after every response too
		default:
			fr.GoneAt = time.Now()
			close(fr.Gone)
		}
	case <-fr.Finished:
	}
}

// fakeBody is what the engine reads of a request body.
type fakeBody struct {
	Stream        bool `json:"stream"`
	StreamOptions *struct {
		IncludeUsage *bool `json:"include_usage"` // vLLM: true unless false or null
	} `json:"stream_options"`
	N      int `json:"n"`
	Prompt any `json:"prompt"`
}

// wantsUsage is whether a stream ends with a usage event, as vLLM decides.
func (b fakeBody) wantsUsage() bool {
	so := b.StreamOptions
	return so != nil && (so.IncludeUsage == nil || *so.IncludeUsage)
}

// fakePlan is the answer the request's X-Fake-* headers ask for.
type fakePlan struct {
	events   int           // X-Fake-Tokens
	perEvent int           // X-Fake-Per-Event
	ttft     time.Duration // X-Fake-TTFT
	itl      time.Duration // X-Fake-ITL
	cut      int           // X-Fake-Cut-After; -1 for never
	pause    int           // X-Fake-Pause-After; -1 for never
	cached   int           // X-Fake-Cached; -1 for no report
}

// usage is the usage object the engine reports for the plan.
func (p fakePlan) usage() string {
	cached := ""
	if p.cached >= 0 {
		cached = fmt.Sprintf(`,"prompt_tokens_details":{"cached_tokens":%d}`, p.cached)
	}
	return fmt.Sprintf(`"usage":{"prompt_tokens":7,"total_tokens":%d,"completion_tokens":%d%s}`, 7+p.events*p.perEvent, p.events*p.perEvent, cached)
}

// fakeExchange is one response the engine is writing.
type fakeExchange struct {
	w  http.ResponseWriter
	r  *http.Request
	fr *fakeRequest
}

// wait sleeps d, and reports false if the client left first.
func (x *fakeExchange) wait(d time.Duration) bool {
	select {
	case <-time.After(d):
		return true
	case <-x.r.Context().Done():
		<-x.fr.Gone // recorded before the handler returns
		return false
	}
}

// setHeaders sets the headers every answer has, and those the request's
// X-Fake-Server-Timing and X-Fake-Hop ask for.
func (x *fakeExchange) setHeaders() {
	h := x.w.Header()
	h.Set("X-Engine", "fake")
	for _, v := range x.r.Header.Values("X-Fake-Server-Timing") {
		h.Add("Server-Timing", v)
	}
	if x.r.Header.Get("X-Fake-Hop") != "" {
		h.Set("Connection", "X-Resp-Drop")
		h.Set("X-Resp-Drop", "1")
		h.Set("Keep-Alive", "timeout=5")
		h.Set("X-Resp-Keep", "1")
	}
}

// fail answers with status and an OpenAI error body.
func (x *fakeExchange) fail(status int) {
	x.w.Header().Set("Content-Type", "application/json")
	x.fr.HeadersSent = time.Now()
	x.w.WriteHeader(status)
	writeAll(x.w, x.fr, fmt.Sprintf(`{"error":{"message":"fake failure","type":"BadRequestError","param":null,"code":%d}}`, status))
}

// answer sends a non-streaming body once the whole generation would have
// taken: X-Fake-Body verbatim, else a chat completion.
func (x *fakeExchange) answer(p fakePlan) {
	if !x.wait(p.ttft + time.Duration(max(p.events-1, 0))*p.itl) {
		return
	}
	x.w.Header().Set("Content-Type", "application/json")
	x.fr.HeadersSent = time.Now()
	if b := x.r.Header.Get("X-Fake-Body"); b != "" {
		writeAll(x.w, x.fr, b)
		return
	}
	writeAll(x.w, x.fr, `{"id":"cmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop","stop_reason":null}],`+p.usage()+`}`)
}

// send writes one SSE event and flushes it.
func (x *fakeExchange) send(data string) {
	writeAll(x.w, x.fr, "data: "+data+"\n\n")
	x.w.(http.Flusher).Flush()
}

// stream sends an SSE stream: for chat a role event first and a finish
// event after the tokens, then the usage if asked for, then [DONE].
func (x *fakeExchange) stream(p fakePlan, chat, usage bool) {
	late := x.r.Header.Get("X-Fake-Late-Headers") != ""
	if late && !x.wait(p.ttft) {
		return
	}
	x.w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	x.fr.HeadersSent = time.Now()
	x.w.WriteHeader(200)
	role := `{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`
	if late {
		// Headers and the role event wait in the buffer for the first
		// token's flush: one write, as a server that does not flush
		// before its first chunk sends them.
		if chat {
			writeAll(x.w, x.fr, "data: "+role+"\n\n")
		}
		p.ttft = 0
	} else {
		x.w.(http.Flusher).Flush()
		if chat {
			x.send(role)
		}
	}
	if !x.wait(p.ttft) {
		return
	}
	if !x.sendTokens(p, chat) {
		return
	}
	if chat {
		x.send(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}`)
	}
	if usage {
		x.fr.UsageSent = time.Now()
		x.send(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],` + p.usage() + `}`)
	}
	x.send("[DONE]")
}

// sendTokens sends the plan's token events, p.itl apart, stamping each;
// it reports false if the client left or the plan cut the connection.
func (x *fakeExchange) sendTokens(p fakePlan, chat bool) bool {
	for i := 0; i < p.events; i++ {
		if i > 0 && !x.wait(p.itl) {
			return false
		}
		if i == p.pause {
			x.wait(time.Hour) // until the client leaves
			return false
		}
		if i == p.cut {
			hj, _, _ := x.w.(http.Hijacker).Hijack()
			hj.Close()
			return false
		}
		text := fmt.Sprintf(" t%d", i)
		now := time.Now()
		if i == 0 {
			x.fr.FirstToken = now
		}
		x.fr.LastToken = now
		x.fr.TokenSent = append(x.fr.TokenSent, now)
		if chat {
			x.send(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"` + text + `"},"logprobs":null,"finish_reason":null}]}`)
		} else {
			x.send(`{"id":"c","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"` + text + `","logprobs":null,"finish_reason":null,"stop_reason":null}]}`)
		}
	}
	return true
}

func writeAll(w http.ResponseWriter, fr *fakeRequest, s string) {
	fr.Sent.WriteString(s)
	io.WriteString(w, s)
}
