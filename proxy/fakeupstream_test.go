package proxy

import (
	"bytes"
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
//	X-Fake-ITL           ms between token events
//	X-Fake-Tokens        token events to send (default 4)
//	X-Fake-Per-Event     tokens per event (default 1)
//	X-Fake-Status        a status other than 200, with an OpenAI error body
//	X-Fake-Cut-After     close the connection after this many token events
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
	go func() {
		select {
		case <-r.Context().Done():
			select {
			case <-fr.Finished: // the context ends after every response too
			default:
				fr.GoneAt = time.Now()
				close(fr.Gone)
			}
		case <-fr.Finished:
		}
	}()
	f.mu.Lock()
	f.requests = append(f.requests, fr)
	f.mu.Unlock()
	f.arrived <- fr

	wait := func(d time.Duration) bool {
		select {
		case <-time.After(d):
			return true
		case <-r.Context().Done():
			<-fr.Gone // recorded before the handler returns
			return false
		}
	}
	if !wait(headerMillis(r.Header, "X-Fake-Header-Delay", 0)) {
		return
	}
	w.Header().Set("X-Engine", "fake")
	for _, v := range r.Header.Values("X-Fake-Server-Timing") {
		w.Header().Add("Server-Timing", v)
	}
	if r.Header.Get("X-Fake-Hop") != "" {
		w.Header().Set("Connection", "X-Resp-Drop")
		w.Header().Set("X-Resp-Drop", "1")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("X-Resp-Keep", "1")
	}
	if status := headerInt(r.Header, "X-Fake-Status", 200); status != 200 {
		w.Header().Set("Content-Type", "application/json")
		fr.HeadersSent = time.Now()
		w.WriteHeader(status)
		writeAll(w, fr, fmt.Sprintf(`{"error":{"message":"fake failure","type":"BadRequestError","param":null,"code":%d}}`, status))
		return
	}
	var req struct {
		Stream        bool `json:"stream"`
		StreamOptions *struct {
			IncludeUsage *bool `json:"include_usage"` // vLLM: true unless false or null
		} `json:"stream_options"`
		N      int `json:"n"`
		Prompt any `json:"prompt"`
	}
	json.Unmarshal(body, &req)
	chat := r.URL.Path == "/v1/chat/completions"
	events := headerInt(r.Header, "X-Fake-Tokens", 4)
	perEvent := headerInt(r.Header, "X-Fake-Per-Event", 1)
	itl := headerMillis(r.Header, "X-Fake-ITL", 0)
	cut := headerInt(r.Header, "X-Fake-Cut-After", -1)

	if !req.Stream {
		if !wait(headerMillis(r.Header, "X-Fake-TTFT", 0) + time.Duration(max(events-1, 0))*itl) {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fr.HeadersSent = time.Now()
		if b := r.Header.Get("X-Fake-Body"); b != "" {
			writeAll(w, fr, b)
			return
		}
		writeAll(w, fr, fmt.Sprintf(`{"id":"cmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop","stop_reason":null}],"usage":{"prompt_tokens":7,"total_tokens":%d,"completion_tokens":%d}}`, 7+events*perEvent, events*perEvent))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	fr.HeadersSent = time.Now()
	w.WriteHeader(200)
	w.(http.Flusher).Flush()
	send := func(data string) { writeAll(w, fr, "data: "+data+"\n\n"); w.(http.Flusher).Flush() }
	if chat {
		send(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`)
	}
	if !wait(headerMillis(r.Header, "X-Fake-TTFT", 0)) {
		return
	}
	for i := 0; i < events; i++ {
		if i > 0 && !wait(itl) {
			return
		}
		if i == cut {
			hj, _, _ := w.(http.Hijacker).Hijack()
			hj.Close()
			return
		}
		text := fmt.Sprintf(" t%d", i)
		now := time.Now()
		if i == 0 {
			fr.FirstToken = now
		}
		fr.LastToken = now
		fr.TokenSent = append(fr.TokenSent, now)
		if chat {
			send(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"` + text + `"},"logprobs":null,"finish_reason":null}]}`)
		} else {
			send(`{"id":"c","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"` + text + `","logprobs":null,"finish_reason":null,"stop_reason":null}]}`)
		}
	}
	if chat {
		send(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}`)
	}
	if so := req.StreamOptions; so != nil && (so.IncludeUsage == nil || *so.IncludeUsage) {
		fr.UsageSent = time.Now()
		send(fmt.Sprintf(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":7,"total_tokens":%d,"completion_tokens":%d}}`, 7+events*perEvent, events*perEvent))
	}
	send("[DONE]")
}

func writeAll(w http.ResponseWriter, fr *fakeRequest, s string) {
	fr.Sent.WriteString(s)
	io.WriteString(w, s)
}
