// Package emulator is an OpenAI-compatible engine without a GPU. It speaks
// vLLM's wire format (chat and completions, streaming and not, usage and
// errors as vLLM sends them) with timing set per server and per request,
// and it records when it sent headers, the first and last token, and when
// its client went away: the truth the sidecar's numbers are checked
// against. The sidecar's demo command runs it as its engine.
package emulator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// Timing is how the emulated engine paces a response. Each field can be
// overridden per request with a header (see the X-Emulator-* constants).
type Timing struct {
	// HeaderDelay is the wait before the response headers: the engine's
	// queue, as seen from outside.
	HeaderDelay time.Duration
	// TTFT is the wait from the headers to the first token event.
	TTFT time.Duration
	// ITL is the gap between token events.
	ITL time.Duration
	// TokensPerEvent is how many tokens one event carries.
	TokensPerEvent int
	// OutputTokens is the tokens per choice when the request sets no
	// max_tokens.
	OutputTokens int
	// KVTransfer is a decode leg's wait before its first token, pulling
	// the KV cache the prefill engine computed (in place of TTFT).
	KVTransfer time.Duration
	// Preprocess is the work before the engine's own clock starts (the
	// HTTP request read, the chat template, the tokenizer), spent before
	// the headers and in no interval the engine reports.
	Preprocess time.Duration
}

// Per-request overrides and fault injection, as request headers.
const (
	HeaderHeaderDelay    = "X-Emulator-Header-Delay"     // duration, e.g. "20ms"
	HeaderTTFT           = "X-Emulator-TTFT"             // duration
	HeaderPreprocess     = "X-Emulator-Preprocess"       // duration, before the engine's clock (Timing.Preprocess)
	HeaderITL            = "X-Emulator-ITL"              // duration
	HeaderTokensPerEvent = "X-Emulator-Tokens-Per-Event" // integer
	HeaderStatus         = "X-Emulator-Status"           // answer with this HTTP error status
	HeaderErrorAfter     = "X-Emulator-Error-After"      // in-stream error event after this many token events
	HeaderCutAfter       = "X-Emulator-Cut-After"        // drop the connection after this many token events
	HeaderStall          = "X-Emulator-Stall"            // "N:duration": after N token events, pause this long more (a preemption)
	HeaderRequestID      = "X-Request-Id"                // becomes the response id's suffix
	HeaderStamp          = "X-Emulator-Stamp"            // "1": each token event's text is " @<send time, Unix ns>"
	HeaderOutput         = "X-Emulator-Output"           // what the response holds: see OutputText and the others
	HeaderCachedTokens   = "X-Emulator-Cached-Tokens"    // prompt tokens the prefix cache serves (all but the last at most); TTFT shrinks to the rest's share
	HeaderKVTransfer     = "X-Emulator-KV-Transfer"      // duration: a decode leg's KV pull before its first token
	HeaderLateHeaders    = "X-Emulator-Late-Headers"     // "1": a stream's headers go out with its first token
)

// Config configures a Server.
type Config struct {
	Timing Timing
	// Model is the served model's name.
	Model string
	// Strict refuses unknown top-level request fields with a 400, as
	// strict OpenAI-compatible servers do (include_metrics among them).
	Strict bool
	// PerRequestMetrics plays vLLM's --enable-per-request-metrics, which
	// needs no request field: every answer gets the engine's own
	// "metrics" object, at the top of a non-streaming body (null for
	// several choices) and on the usage event of a stream (none for
	// several choices).
	PerRequestMetrics bool
	// SpecDecodeMetrics plays vLLM 0.28's --per-request-spec-decode-metrics:
	// "summary" or "detailed" puts a "speculative_decoding" member in the
	// same metrics object (alone without PerRequestMetrics). The
	// detailed form adds the
	// per-step acceptance (per_step_accepted_tokens). Empty: none.
	SpecDecodeMetrics string
	// PromptTokensDetails plays vLLM's --enable-prompt-tokens-details:
	// the usage reports the prompt tokens served by the prefix cache
	// (HeaderCachedTokens), as prompt_tokens_details.cached_tokens, with
	// those it wrote to the cache (created_cache_tokens), and
	// the Messages API as cache_read_input_tokens apart from input_tokens,
	// as Anthropic's API counts them (and vLLM's Anthropic server, since it
	// reports the cache). The Responses API always reports them.
	PromptTokensDetails bool
	// RequestStatsHeaders plays vLLM's proposed
	// --enable-request-stats-headers: non-streaming chat and completions
	// responses carry the engine's own timing and token counts as
	// x-vllm-* headers.
	RequestStatsHeaders bool
	// TGIHeaders plays Hugging Face's TGI: non-streaming answers carry
	// its timing headers (x-compute-type, x-total-time, x-queue-time,
	// x-inference-time, x-time-per-token and the others; whole ms).
	TGIHeaders bool
	// LateHeaders sends a stream's response headers with its first token,
	// in one write, as a server that does not flush before its first
	// chunk does (llm-d's simulator, a routing proxy answering once the
	// decode starts).
	LateHeaders bool
	// MaxModelLen is the emulated context length, as vLLM's
	// --max-model-len: a request whose prompt and max_tokens exceed it
	// gets vLLM's 400. Zero means DefaultMaxModelLen.
	MaxModelLen int
}

// DefaultMaxModelLen is the emulated model's context length in tokens,
// prompt and output together, and the max_model_len /v1/models reports.
// A stream costs the same memory whatever its length, since its tokens are
// made as they are sent; the limit bounds what holds the whole output: a
// non-streaming body and the Responses API's closing events.
const DefaultMaxModelLen = 8192

// DefaultTiming is a small, fast model.
var DefaultTiming = Timing{TTFT: 50 * time.Millisecond, ITL: 10 * time.Millisecond, TokensPerEvent: 1, OutputTokens: 16}

// keptRecords is how many requests' records a Server keeps: the latest,
// for Wait and Last. A long-lived engine (timing-sidecar emulate, the
// benchmarks' tens of thousands of requests a second) would otherwise
// grow by every request's body and headers, and its collector's work with
// it, beside what it measures.
const keptRecords = 10_000

// Record is what the engine did for one request.
type Record struct {
	ID     string
	Path   string
	Body   []byte // the request body as received
	Header http.Header
	Stream bool
	// Status is the HTTP status sent.
	Status int
	// Received is when the engine had read the whole request: after the
	// sidecar sent it, so an upper bound for the sidecar's arrival mark.
	Received time.Time
	// HeadersSent is the moment the engine began writing the response
	// headers (for a non-streaming response, its headers and whole body).
	// Like the token stamps below it is read before the first byte goes
	// out, never after the flush, so it is a lower bound for any mark the
	// sidecar takes on those bytes, whatever the scheduler does.
	HeadersSent time.Time
	// FirstToken and LastToken are the moments the engine began writing
	// the first and the last token event (streams). With several choices
	// a step sends one event per choice; the stamp is the step's, taken
	// before its first event.
	FirstToken, LastToken time.Time
	// Done is when the handler returned.
	Done time.Time
	// FirstReasoning and FirstContent are the moments the engine began
	// writing the first reasoning and the first content (text or tool
	// call) events of a chat stream.
	FirstReasoning, FirstContent time.Time
	// ClientGone is when the engine saw its client go away, zero if the
	// client stayed to the end.
	ClientGone time.Time
	// TokenEvents counts token events sent; PromptTokens and
	// CompletionTokens are the usage the engine reported.
	TokenEvents                    int
	PromptTokens, CompletionTokens int
	// CachedTokens is the prompt tokens the prefix cache served.
	CachedTokens int
	// MaxTokenGap is the largest gap between the stamps of two consecutive
	// token events: the engine's own pacing, the truth for max_itl_ms.
	MaxTokenGap time.Duration
}

// Server is a running emulated engine.
type Server struct {
	cfg     Config
	created int64

	mu      sync.Mutex
	seq     int
	records map[string]*entry
	order   []*entry // records, oldest first
	keep    int      // records kept: keptRecords
	counts  map[string]int

	srv   *http.Server
	ln    net.Listener
	conns sync.Map // net.Conn -> struct{}: connections open now
}

type entry struct {
	rec  Record
	done chan struct{}
}

// New returns a Server; call Start or use Handler.
func New(cfg Config) *Server {
	if cfg.Model == "" {
		cfg.Model = "emulated/llama-3.1-8b-instruct"
	}
	if cfg.Timing.TokensPerEvent < 1 {
		cfg.Timing.TokensPerEvent = 1
	}
	if cfg.Timing.OutputTokens < 1 {
		cfg.Timing.OutputTokens = DefaultTiming.OutputTokens
	}
	if cfg.MaxModelLen < 1 {
		cfg.MaxModelLen = DefaultMaxModelLen
	}
	s := &Server{cfg: cfg, created: time.Now().Unix(), records: map[string]*entry{}, counts: map[string]int{}, keep: keptRecords}
	s.srv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second,
		ConnState: func(c net.Conn, state http.ConnState) {
			switch state {
			case http.StateNew:
				s.conns.Store(c, struct{}{})
			case http.StateClosed, http.StateHijacked:
				s.conns.Delete(c)
			}
		}}
	return s
}

// Start listens on addr ("127.0.0.1:0" for a free port) and serves in the
// background.
func (s *Server) Start(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("emulator listen on %s: %w", addr, err)
	}
	s.ln = ln
	go s.srv.Serve(ln) //nolint:errcheck // ends with Close
	return nil
}

// OpenConnections is how many client connections the server has open.
func (s *Server) OpenConnections() int {
	n := 0
	s.conns.Range(func(_, _ any) bool { n++; return true })
	return n
}

// URL is the base URL of a started server.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// Close stops the server and drops its connections.
func (s *Server) Close() error { return s.srv.Close() }

// Handler serves the engine's routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.generate)
	mux.HandleFunc("POST /v1/completions", s.generate)
	mux.HandleFunc("POST /v1/messages", s.generate)
	mux.HandleFunc("POST /v1/responses", s.generate)
	for _, path := range []string{"/v1/embeddings", "/pooling", "/classify", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank"} {
		mux.HandleFunc("POST "+path, s.pool)
	}
	mux.HandleFunc("POST /v1/audio/transcriptions", s.audio)
	mux.HandleFunc("POST /v1/audio/translations", s.audio)
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { s.count("/health") })
	mux.HandleFunc("GET /metrics", s.metrics)
	return mux
}

// Wait returns the record of request id once the engine is done with it.
func (s *Server) Wait(ctx context.Context, id string) (Record, error) {
	e, err := s.entry(ctx, id)
	if err != nil {
		return Record{}, err
	}
	select {
	case <-e.done:
		s.mu.Lock()
		defer s.mu.Unlock()
		return e.rec, nil
	case <-ctx.Done():
		return Record{}, fmt.Errorf("request %s still running: %w", id, ctx.Err())
	}
}

// Started returns once request id has reached the engine (its Received
// stamp is set), done or not.
func (s *Server) Started(ctx context.Context, id string) error {
	_, err := s.entry(ctx, id)
	return err
}

// entry waits for request id to arrive.
func (s *Server) entry(ctx context.Context, id string) (*entry, error) {
	for {
		s.mu.Lock()
		e := s.records[id]
		s.mu.Unlock()
		if e != nil {
			return e, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no request %s: %w", id, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// Last returns the record of the latest request once it is done.
func (s *Server) Last(ctx context.Context) (Record, error) {
	s.mu.Lock()
	if len(s.order) == 0 {
		s.mu.Unlock()
		return Record{}, errors.New("no request yet")
	}
	id := s.order[len(s.order)-1].rec.ID
	s.mu.Unlock()
	return s.Wait(ctx, id)
}

func (s *Server) count(path string) {
	s.mu.Lock()
	s.counts[path]++
	s.mu.Unlock()
}

func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	s.count("/v1/models")
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []map[string]any{{
		"id": s.cfg.Model, "object": "model", "created": s.created, "owned_by": "vllm",
		"root": s.cfg.Model, "parent": nil, "max_model_len": s.cfg.MaxModelLen,
	}}})
}

func (s *Server) metrics(w http.ResponseWriter, _ *http.Request) {
	s.count("/metrics")
	s.mu.Lock()
	defer s.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	fmt.Fprintln(w, "# HELP emulator_requests_total Requests served, by path.")
	fmt.Fprintln(w, "# TYPE emulator_requests_total counter")
	for _, p := range []string{"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"} {
		fmt.Fprintf(w, "emulator_requests_total{path=%q} %d\n", p, s.counts[p])
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", fmt.Sprint(len(b)))
	w.WriteHeader(status)
	w.Write(b) //nolint:errcheck
}
