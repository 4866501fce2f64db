package emulator

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// request is the part of a chat or completions request the engine reads.
type request struct {
	Model         string          `json:"model"`
	Messages      json.RawMessage `json:"messages"`
	Input         json.RawMessage `json:"input"` // the Responses API's
	Prompt        json.RawMessage `json:"prompt"`
	Stream        LaxBool         `json:"stream"`
	StreamOptions *struct {
		// A pointer: vLLM defaults it to true when stream_options is sent.
		IncludeUsage         *LaxBool `json:"include_usage"`
		ContinuousUsageStats LaxBool  `json:"continuous_usage_stats"`
	} `json:"stream_options"`
	N                   *int            `json:"n"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Logprobs            json.RawMessage `json:"logprobs"` // chat: a boolean; completions: how many alternatives
	TopLogprobs         int             `json:"top_logprobs"`
	IncludeMetrics      LaxBool         `json:"include_metrics"`
	// KVTransferParams is vLLM's disaggregated prefill: a prefill leg
	// (do_remote_decode) answers with the KV's whereabouts, a decode leg
	// (do_remote_prefill) pulls it before its first token.
	KVTransferParams *struct {
		DoRemoteDecode  bool `json:"do_remote_decode"`
		DoRemotePrefill bool `json:"do_remote_prefill"`
	} `json:"kv_transfer_params"`
}

// knownFields are the request fields a strict server accepts.
var knownFields = map[string]bool{
	"model": true, "messages": true, "prompt": true, "stream": true, "stream_options": true, "n": true,
	"max_tokens": true, "max_completion_tokens": true, "temperature": true, "top_p": true, "stop": true,
	"seed": true, "logprobs": true, "top_logprobs": true, "user": true, "presence_penalty": true,
	"frequency_penalty": true, "tools": true, "tool_choice": true, "response_format": true, "echo": true,
	"best_of": true, "suffix": true, "logit_bias": true, "ignore_eos": true, "min_tokens": true,
	// Messages' and Responses' own.
	"system": true, "stop_sequences": true, "top_k": true, "metadata": true,
	"input": true, "instructions": true, "max_output_tokens": true,
	"kv_transfer_params": true,
}

// words is the emulated model's vocabulary: one word is one token.
var words = strings.Fields("the quick brown fox jumps over the lazy dog while a patient engine counts every token it sends")

// generation is one request being served.
type generation struct {
	s       *Server
	w       http.ResponseWriter
	r       *http.Request
	e       *entry
	req     request
	timing  Timing
	chat    bool
	choices int
	tokens  int // per choice
	prompt  int
	// cached is the prompt tokens the emulated prefix cache served.
	cached int
	// faults, -1 when off
	errorAfter, cutAfter int
	// stallAfter is the token events after which the stream pauses
	// stall more than its ITL (HeaderStall); -1 when it does not.
	stallAfter int
	stall      time.Duration
	// stamp: token events carry their send time instead of words, so a
	// load tool can measure each event's delivery delay.
	stamp bool
	// output is what the response holds (OutputText and the others).
	output string
	// api is the endpoint's wire format.
	api string
	// logprobs: the request asked for them; topLogprobs (chat) and
	// completionTop (completions) are how many alternatives.
	logprobs                   bool
	topLogprobs, completionTop int
	// holdFlush keeps written events in the buffer: a stream's headers
	// and opening wait for its first token (lateHeaders).
	holdFlush bool
}

func (s *Server) generate(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	s.count(path)
	body, _ := io.ReadAll(r.Body)
	g := &generation{s: s, w: w, r: r, chat: path == "/v1/chat/completions", api: apiOf(path)}
	g.e = s.begin(r, body)
	defer g.finish()
	go g.watchClient()

	t, err := g.timingFor(r.Header)
	if err != nil {
		g.fail(http.StatusBadRequest, "BadRequestError", err.Error())
		return
	}
	g.timing = t
	if status, _ := strconv.Atoi(r.Header.Get(HeaderStatus)); status >= 400 {
		if !g.wait(t.HeaderDelay) {
			return
		}
		g.fail(status, "BadRequestError", fmt.Sprintf("emulated error %d", status))
		return
	}
	if msg := g.parse(body); msg != "" {
		g.fail(http.StatusBadRequest, "BadRequestError", msg)
		return
	}
	if msg := g.prefixCache(r.Header); msg != "" {
		g.fail(http.StatusBadRequest, "BadRequestError", msg)
		return
	}
	g.e.rec.Stream = bool(g.req.Stream)
	if p := g.req.KVTransferParams; p != nil && p.DoRemotePrefill {
		g.timing.TTFT = g.timing.KVTransfer // the prompt's KV is pulled, not computed
	}
	switch {
	case g.api == apiMessages && bool(g.req.Stream):
		g.streamTyped(g.messagesEvents())
	case g.api == apiMessages:
		g.unaryMessages()
	case g.api == apiResponses && bool(g.req.Stream):
		g.streamTyped(g.responsesEvents())
	case g.api == apiResponses:
		g.unaryResponses()
	case bool(g.req.Stream):
		g.stream()
	default:
		g.unary()
	}
}

func (s *Server) begin(r *http.Request, body []byte) *entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	suffix := r.Header.Get(HeaderRequestID)
	if suffix == "" {
		suffix = strconv.Itoa(s.seq)
	}
	prefix := "cmpl-"
	switch r.URL.Path {
	case "/v1/chat/completions":
		prefix = "chatcmpl-"
	case "/v1/messages":
		prefix = "msg_"
	case "/v1/responses":
		prefix = "resp_"
	}
	e := &entry{done: make(chan struct{}), rec: Record{
		ID: prefix + suffix, Path: r.URL.Path, Body: body, Header: r.Header.Clone(), Received: time.Now(),
	}}
	s.records[e.rec.ID] = e
	s.order = append(s.order, e)
	s.forgetOldRecords()
	return e
}

// forgetOldRecords drops the oldest finished records past s.keep.
// Callers hold mu.
func (s *Server) forgetOldRecords() {
	for len(s.order) > s.keep {
		e := s.order[0]
		select {
		case <-e.done:
		default:
			return // still running: kept, and those after it
		}
		if s.records[e.rec.ID] == e { // not an id a later request took
			delete(s.records, e.rec.ID)
		}
		s.order[0] = nil
		s.order = s.order[1:]
	}
}

func (g *generation) finish() {
	g.s.mu.Lock()
	g.e.rec.Done = time.Now()
	g.s.mu.Unlock()
	close(g.e.done)
}

// watchClient records the moment the client goes away, if it does.
func (g *generation) watchClient() {
	select {
	case <-g.r.Context().Done():
		g.noteGone()
	case <-g.e.done:
	}
}

// noteGone records that the client left, once, unless the request is
// already done. The handler calls it too when it sees the client gone, so
// the record has it before the handler returns.
func (g *generation) noteGone() {
	g.s.mu.Lock()
	if g.e.rec.Done.IsZero() && g.e.rec.ClientGone.IsZero() {
		g.e.rec.ClientGone = time.Now()
	}
	g.s.mu.Unlock()
}

func (g *generation) mark(f func(*Record)) {
	g.s.mu.Lock()
	f(&g.e.rec)
	g.s.mu.Unlock()
}

func (g *generation) timingFor(h http.Header) (Timing, error) {
	t := g.s.cfg.Timing
	for _, d := range []struct {
		header string
		dst    *time.Duration
	}{{HeaderHeaderDelay, &t.HeaderDelay}, {HeaderTTFT, &t.TTFT}, {HeaderITL, &t.ITL}, {HeaderKVTransfer, &t.KVTransfer}, {HeaderPreprocess, &t.Preprocess}} {
		if v := h.Get(d.header); v != "" {
			parsed, err := time.ParseDuration(v)
			if err != nil {
				return t, fmt.Errorf("%s: %w", d.header, err)
			}
			*d.dst = parsed
		}
	}
	// The preprocessing comes before the headers, as the queue does.
	t.HeaderDelay += t.Preprocess
	if v := h.Get(HeaderTokensPerEvent); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return t, fmt.Errorf("%s: want a positive integer", HeaderTokensPerEvent)
		}
		t.TokensPerEvent = n
	}
	g.errorAfter, g.cutAfter = -1, -1
	g.stamp = h.Get(HeaderStamp) == "1"
	switch g.output = h.Get(HeaderOutput); g.output {
	case "":
		g.output = OutputText
	case OutputText, OutputUnicode:
	case OutputTools, OutputReasoning, OutputReasoningField:
		if !g.chat {
			return t, fmt.Errorf("%s: %s is for chat", HeaderOutput, g.output)
		}
	default:
		return t, fmt.Errorf("%s: unknown output %q", HeaderOutput, g.output)
	}
	if v, err := strconv.Atoi(h.Get(HeaderErrorAfter)); err == nil {
		g.errorAfter = v
	}
	if v, err := strconv.Atoi(h.Get(HeaderCutAfter)); err == nil {
		g.cutAfter = v
	}
	return t, g.parseStall(h.Get(HeaderStall))
}

// parseStall reads HeaderStall's "N:duration".
func (g *generation) parseStall(v string) error {
	g.stallAfter = -1
	if v == "" {
		return nil
	}
	n, d, ok := strings.Cut(v, ":")
	after, err := strconv.Atoi(n)
	stall, err2 := time.ParseDuration(d)
	if !ok || err != nil || err2 != nil || after < 1 || stall < 0 {
		return fmt.Errorf("%s: want N:duration, e.g. 3:300ms", HeaderStall)
	}
	g.stallAfter, g.stall = after, stall
	return nil
}

// parse reads the request; it returns an error message for a 400. The
// stages run in order and the first message wins, as vLLM checks them.
func (g *generation) parse(body []byte) string {
	for _, stage := range []func() string{
		func() string { return g.decode(body) },
		g.checkInputs,
		g.countChoices,
		g.countTokens,
		g.parseLogprobs,
	} {
		if msg := stage(); msg != "" {
			return msg
		}
	}
	return ""
}

// decode reads body into g.req, refusing unknown fields on a strict
// server.
func (g *generation) decode(body []byte) string {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return "invalid JSON body: " + err.Error()
	}
	if g.s.cfg.Strict {
		for k := range fields {
			if !g.accepts(k) {
				return fmt.Sprintf("unknown field %q", k)
			}
		}
	}
	// Python's json and pydantic match keys exactly; encoding/json would
	// match "Stream" to stream. Only the exact keys are decoded, each
	// one's last copy (as in the map).
	exact := make(map[string]json.RawMessage, len(fields))
	for k, v := range fields {
		if g.accepts(k) || k == "include_metrics" {
			exact[k] = v
		}
	}
	b, _ := json.Marshal(exact)
	if err := json.Unmarshal(b, &g.req); err != nil {
		return "invalid request: " + err.Error()
	}
	return ""
}

// accepts tells whether a strict server takes field k: include_metrics
// only from an engine that answers it.
func (g *generation) accepts(k string) bool {
	metrics := g.s.cfg.PerRequestMetrics || g.s.cfg.SpecDecodeMetrics != ""
	return knownFields[k] || k == "include_metrics" && metrics
}

// checkInputs checks that the request has what its API generates from.
func (g *generation) checkInputs() string {
	if g.api == apiResponses {
		if len(g.req.Input) == 0 {
			return "input is required"
		}
	} else if (g.chat || g.api == apiMessages) && len(g.req.Messages) == 0 {
		return "messages is required"
	}
	if g.api == apiCompletions && len(g.req.Prompt) == 0 {
		return "prompt is required"
	}
	if g.req.StreamOptions != nil && !g.req.Stream {
		return "stream_options can only be set if stream is true"
	}
	return ""
}

// countChoices sets g.choices: n for each prompt of a completions request
// (a list of strings or of token lists is several prompts).
func (g *generation) countChoices() string {
	n := 1
	if g.req.N != nil {
		n = *g.req.N
	}
	if n < 1 {
		return "n must be at least 1"
	}
	prompts := 1
	var list []json.RawMessage
	if !g.chat && json.Unmarshal(g.req.Prompt, &list) == nil && len(list) > 0 && (list[0][0] == '"' || list[0][0] == '[') {
		prompts = len(list)
	}
	g.choices = n * prompts
	return ""
}

// countTokens sets g.prompt and g.tokens (per choice), the request's
// max_tokens or max_completion_tokens (the latter when both) or the
// server's default.
func (g *generation) countTokens() string {
	g.prompt = promptTokens(g.req.Messages, g.req.Prompt, g.req.Input)
	g.tokens = g.timing.OutputTokens
	asked := false
	for _, m := range []*int{g.req.MaxTokens, g.req.MaxCompletionTokens} {
		if m != nil {
			g.tokens, asked = *m, true
		}
	}
	if g.tokens < 1 {
		return "max_tokens must be at least 1"
	}
	if limit := g.s.cfg.MaxModelLen; asked && g.tokens > limit-g.prompt {
		// vLLM's words (0.10 to 0.17), and its check: prompt and output
		// must fit the context.
		return fmt.Sprintf("'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens "+
			"and your request has %d input tokens (%d > %d - %d).", g.tokens, limit, g.prompt, g.tokens, limit, g.prompt)
	}
	return ""
}

// parseLogprobs reads logprobs: a boolean for chat (with top_logprobs
// alternatives), how many alternatives for completions.
func (g *generation) parseLogprobs() string {
	switch lp := strings.TrimSpace(string(g.req.Logprobs)); {
	case g.chat && lp == "true":
		g.logprobs, g.topLogprobs = true, g.req.TopLogprobs
	case !g.chat && lp != "" && lp != "null":
		n, err := strconv.Atoi(lp)
		if err != nil || n < 0 {
			return "logprobs must be a non-negative integer"
		}
		g.logprobs, g.completionTop = true, n
	}
	return ""
}

// promptTokens counts whitespace-separated words, a stand-in tokenizer.
func promptTokens(parts ...json.RawMessage) int {
	n := 0
	for _, p := range parts {
		n += len(strings.Fields(string(p)))
	}
	return max(n, 1)
}

// wait sleeps for d unless the client leaves first.
func (g *generation) wait(d time.Duration) bool {
	if d <= 0 {
		if g.r.Context().Err() != nil {
			g.noteGone()
			return false
		}
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-g.r.Context().Done():
		g.noteGone()
		return false
	}
}

func (g *generation) fail(status int, typ, msg string) {
	g.mark(func(r *Record) { r.Status, r.HeadersSent = status, time.Now() })
	writeJSON(g.w, status, newAPIError(status, typ, msg))
}

// text is the output of tokens [from, from+n) of one choice.
func text(from, n int) string {
	var b strings.Builder
	for i := from; i < from+n; i++ {
		b.WriteByte(' ')
		b.WriteString(words[i%len(words)])
	}
	return b.String()
}

// includeUsage is vLLM's rule: the usage event comes when stream_options
// is sent, unless include_usage is false or null.
func (g *generation) includeUsage() bool {
	so := g.req.StreamOptions
	return so != nil && (so.IncludeUsage == nil || bool(*so.IncludeUsage))
}

func (g *generation) finishReason() string {
	if g.output == OutputTools {
		return "tool_calls"
	}
	if g.req.MaxTokens != nil || g.req.MaxCompletionTokens != nil {
		return "length"
	}
	return "stop"
}

// prefixCache plays a prefix cache serving the prompt tokens
// HeaderCachedTokens names, at most all but the last (an engine always
// computes the last): the prefill, TTFT, shrinks to the uncached share.
func (g *generation) prefixCache(h http.Header) string {
	v := h.Get(HeaderCachedTokens)
	if v == "" {
		return ""
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return HeaderCachedTokens + ": want a count of tokens"
	}
	g.cached = min(n, g.prompt-1)
	if g.prompt > 0 {
		g.timing.TTFT = g.timing.TTFT * time.Duration(g.prompt-g.cached) / time.Duration(g.prompt)
	}
	g.mark(func(r *Record) { r.CachedTokens = g.cached })
	return ""
}

// reportsCache: the usage reports the cached tokens, as vLLM's does with
// --enable-prompt-tokens-details (the Responses API always does).
func (g *generation) reportsCache() bool { return g.s.cfg.PromptTokensDetails }

func (g *generation) usage(completion int) usage {
	u := usage{PromptTokens: g.prompt, TotalTokens: g.prompt + completion, CompletionTokens: completion}
	if g.reportsCache() {
		u.PromptTokensDetails = &promptDetails{CachedTokens: g.cached, CreatedCacheTokens: (g.prompt - g.cached) / 16 * 16}
	}
	if g.output == OutputReasoning && g.chat {
		u.CompletionTokensDetails = &tokenDetails{ReasoningTokens: min(completion, g.thinking()*g.choices)}
	}
	return u
}

func (g *generation) unary() {
	steps := g.steps(g.timing.TokensPerEvent)
	if !g.wait(g.timing.HeaderDelay + g.timing.TTFT + time.Duration(len(steps)-1)*g.timing.ITL) {
		return
	}
	id, object := g.e.rec.ID, "text_completion"
	var choices any
	reason := g.finishReason()
	if g.chat {
		object = "chat.completion"
		cs := make([]chatChoice, g.choices)
		for i := range cs {
			cs[i] = chatChoice{Index: i, FinishReason: reason, Message: g.message(steps)}
			if g.logprobs {
				cs[i].Logprobs = map[string]any{"content": g.chatLogprobs(allTokens(steps), 0)}
			}
		}
		choices = cs
	} else {
		cs := make([]completionChoice, g.choices)
		for i := range cs {
			cs[i] = completionChoice{Index: i, Text: joinText(stepsContent(steps)), FinishReason: reason}
			if g.logprobs {
				cs[i].Logprobs = g.completionLogprobs(allTokens(steps), 0, 0)
			}
		}
		choices = cs
	}
	total := g.tokens * g.choices
	// The engine's own view of the wait it just did.
	scheduled := g.e.rec.Received.Add(g.timing.HeaderDelay)
	first := scheduled.Add(g.timing.TTFT)
	last := first.Add(time.Duration(len(steps)-1) * g.timing.ITL)
	g.mark(func(r *Record) {
		r.Status, r.HeadersSent = http.StatusOK, time.Now()
		r.PromptTokens, r.CompletionTokens = g.prompt, total
	})
	g.statsHeaders(scheduled, first, last, total)
	writeJSON(g.w, http.StatusOK, completion{ID: id, Object: object, Created: g.s.created, Model: g.s.cfg.Model,
		Choices: choices, Usage: g.usage(total), Metrics: g.engineMetrics(scheduled, first, last, g.tokens),
		KVTransferParams: g.kvHandOver()})
}

// message is the non-streaming chat message with the output of steps.
func (g *generation) message(steps []step) chatMessage {
	m := chatMessage{Role: "assistant", ToolCalls: []toolCall{}, ReasoningContent: json.RawMessage("null")}
	if g.output == OutputTools {
		tc := toolCall{}
		for _, st := range steps {
			if st.tool.ID != "" {
				tc.ID, tc.Type, tc.Function.Name = st.tool.ID, st.tool.Type, st.tool.Function.Name
			}
			tc.Function.Arguments += st.tool.Function.Arguments
		}
		m.ToolCalls = append(m.ToolCalls, tc)
		return m
	}
	content := joinText(stepsContent(steps))
	m.Content = &content
	var reasoning []json.RawMessage
	for _, st := range steps {
		if st.reasoning != nil {
			reasoning = append(reasoning, st.reasoning)
		}
	}
	if len(reasoning) > 0 {
		r := joinText(reasoning)
		m.ReasoningContent, _ = json.Marshal(r)
		if g.output == OutputReasoningField {
			m.Reasoning = &r
		}
		if content == "" {
			m.Content = nil // vLLM's reasoning parsers: content or None
		}
	}
	return m
}

func stepsContent(steps []step) []json.RawMessage {
	var out []json.RawMessage
	for _, st := range steps {
		if st.content != nil {
			out = append(out, st.content)
		}
	}
	return out
}

func allTokens(steps []step) []string {
	var out []string
	for _, st := range steps {
		out = append(out, st.tokens...)
	}
	return out
}

// joinText decodes JSON string pieces and joins them: the text a client
// gets whole, however the pieces were split (a surrogate pair included).
func joinText(pieces []json.RawMessage) string {
	var raw []byte
	for _, p := range pieces {
		raw = append(raw, p[1:len(p)-1]...)
	}
	return decodeString(raw)
}

// decodeString decodes the inside of a JSON string.
func decodeString(raw []byte) string {
	var s string
	json.Unmarshal(append(append([]byte{'"'}, raw...), '"'), &s) //nolint:errcheck // pieces are JSON strings
	return s
}

// statsHeaders plays vLLM's request stats headers on a non-streaming
// response (Config.RequestStatsHeaders): the engine's own intervals in
// milliseconds with two decimals, from its marks, the total running to
// now, as the headers go out.
func (g *generation) statsHeaders(scheduled, first, last time.Time, completion int) {
	g.tgiHeaders(scheduled, last, completion)
	if !g.s.cfg.RequestStatsHeaders {
		return
	}
	h := g.w.Header()
	ms := func(d time.Duration) string {
		return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64)
	}
	h.Set("x-vllm-total-time", ms(time.Since(g.engineClock())))
	h.Set("x-vllm-queue-time", ms(scheduled.Sub(g.engineClock())))
	h.Set("x-vllm-prefill-time", ms(first.Sub(scheduled)))
	h.Set("x-vllm-decode-time", ms(last.Sub(first)))
	h.Set("x-vllm-inference-time", ms(last.Sub(scheduled)))
	tpot := time.Duration(0)
	if g.tokens > 1 {
		tpot = last.Sub(first) / time.Duration(g.tokens-1)
	}
	h.Set("x-vllm-time-per-output-token", ms(tpot))
	h.Set("x-vllm-prompt-tokens", strconv.Itoa(g.prompt))
	h.Set("x-vllm-completion-tokens", strconv.Itoa(completion))
	h.Set("x-vllm-cached-tokens", strconv.Itoa(g.cached))
}

// engineClock is when the engine's own clock starts: past the
// preprocessing, which no interval it reports holds.
func (g *generation) engineClock() time.Time { return g.e.rec.Received.Add(g.timing.Preprocess) }

// engineMetrics is the engine's own report when it plays vLLM's
// per-request metrics, which need no request field: from scheduling
// (headers sent) to the first and last token; null for several choices.
func (g *generation) engineMetrics(scheduled, first, last time.Time, tokens int) json.RawMessage {
	spec := g.s.cfg.SpecDecodeMetrics
	if !g.s.cfg.PerRequestMetrics && spec == "" {
		return nil
	}
	if g.choices > 1 {
		return json.RawMessage("null")
	}
	if !g.s.cfg.PerRequestMetrics {
		b, _ := json.Marshal(struct {
			Spec *specDecoding `json:"speculative_decoding"`
		}{specDecodingOf(tokens, spec)})
		return b
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	m := engineMetrics{
		QueueTime:        ms(scheduled.Sub(g.engineClock())),
		TimeToFirstToken: ms(first.Sub(scheduled)),
		GenerationTime:   ms(last.Sub(first)),
	}
	if tokens > 1 {
		itl := m.GenerationTime / float64(tokens-1)
		m.MeanITL = &itl
	}
	if d := last.Sub(scheduled).Seconds(); d > 0 {
		m.TokensPerSecond = float64(tokens) / d
	}
	m.Spec = specDecodingOf(tokens, spec)
	b, _ := json.Marshal(m)
	return b
}

// specDecodingOf is vLLM's speculative decoding report for tokens
// generated with three speculative tokens a step, one accepted in three
// steps: nil when form is empty.
func specDecodingOf(tokens int, form string) *specDecoding {
	if form == "" {
		return nil
	}
	const k = 3
	steps := max(1, (tokens*3+3)/4)
	accepted := tokens - steps
	if accepted < 0 {
		accepted = 0
	}
	s := &specDecoding{NumSpecSteps: steps, NumSpecTokens: k, NumDraftTokens: steps * k, NumAcceptedDraftTokens: accepted,
		AcceptanceHistogram: []int{steps - accepted, accepted, 0, 0}}
	s.MeanAcceptanceLength = float64(tokens) / float64(steps)
	s.DraftAcceptanceRate = float64(accepted) / float64(steps*k)
	if form == "detailed" {
		for i := range steps {
			s.PerStep = append(s.PerStep, min(1, max(0, accepted-i)))
		}
	}
	return s
}

// kvHandOver is a prefill leg's kv_transfer_params, as vLLM's NIXL
// connector returns them: where the decode engine pulls the KV from.
// nil for any other request.
func (g *generation) kvHandOver() json.RawMessage {
	if p := g.req.KVTransferParams; p == nil || !p.DoRemoteDecode {
		return nil
	}
	return json.RawMessage(`{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2,3],` +
		`"remote_engine_id":"emulated-prefill","remote_host":"127.0.0.1","remote_port":5600,"tp_size":1}`)
}

// lateHeaders: this stream's headers go out with its first token.
func (g *generation) lateHeaders() bool {
	return g.s.cfg.LateHeaders || g.r.Header.Get(HeaderLateHeaders) == "1"
}

// tgiHeaders sets TGI's timing headers, as its router does: whole
// milliseconds, x-compute-time in seconds.
func (g *generation) tgiHeaders(scheduled, last time.Time, completion int) {
	if !g.s.cfg.TGIHeaders {
		return
	}
	h := g.w.Header()
	ms := func(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
	total := time.Since(g.engineClock())
	inference := last.Sub(scheduled)
	h.Set("x-compute-type", "gpu+optimized")
	h.Set("x-compute-time", strconv.FormatFloat(total.Seconds(), 'f', -1, 64))
	h.Set("x-total-time", ms(total))
	h.Set("x-validation-time", "0")
	h.Set("x-queue-time", ms(scheduled.Sub(g.engineClock())))
	h.Set("x-inference-time", ms(inference))
	h.Set("x-time-per-token", ms(inference/time.Duration(max(completion, 1))))
	h.Set("x-prompt-tokens", strconv.Itoa(g.prompt))
	h.Set("x-generated-tokens", strconv.Itoa(completion))
}
