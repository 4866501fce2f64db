package emulator

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// vLLM's audio endpoints (vllm/entrypoints/openai/speech_to_text): a
// multipart form with the audio file, model, stream and
// stream_include_usage, read part by part without holding the file;
// answered with {"text": ...} (and the audio's duration as usage), or,
// streamed, with transcription.chunk events of delta.content, a final
// usage event when asked, and [DONE].

func (s *Server) audio(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	s.count(path)
	g := &generation{s: s, w: w, r: r}
	g.e = s.begin(r, nil)
	defer g.finish()
	t, err := g.timingFor(r.Header)
	if err != nil {
		g.fail(http.StatusBadRequest, "BadRequestError", err.Error())
		return
	}
	model, stream, usage, audioBytes, msg := readAudioForm(r)
	if msg != "" {
		g.fail(http.StatusBadRequest, "BadRequestError", msg)
		return
	}
	if model == "" {
		model = s.cfg.Model
	}
	prompt := max(1, audioBytes/1024) // the audio's tokens, made up
	tokens := max(1, t.OutputTokens)
	id := "trsc-" + g.e.rec.ID
	seconds := float64(audioBytes) / 32000 // 16 kHz, 16-bit mono
	if !stream {
		if !g.wait(t.HeaderDelay + t.TTFT + time.Duration(tokens-1)*t.ITL) {
			return
		}
		g.mark(func(rec *Record) {
			rec.Status, rec.HeadersSent, rec.PromptTokens, rec.CompletionTokens = http.StatusOK, time.Now(), prompt, tokens
		})
		writeJSON(w, http.StatusOK, map[string]any{"text": strings.TrimSpace(strings.Repeat("word ", tokens)),
			"usage": map[string]any{"type": "duration", "seconds": seconds}})
		return
	}
	g.streamAudio(t, id, model, prompt, tokens, usage)
}

// readAudioForm reads the form part by part, counting the file's bytes
// without holding them; msg is vLLM's complaint about a form it refuses.
func readAudioForm(r *http.Request) (model string, stream, usage bool, audioBytes int, msg string) {
	form, err := r.MultipartReader()
	if err != nil {
		return "", false, false, 0, "the request is not a multipart form"
	}
	for {
		part, err := form.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", false, false, 0, "the form ends early"
		}
		if part.FileName() != "" {
			n, _ := io.Copy(io.Discard, part) // counted, never held
			audioBytes += int(n)
			continue
		}
		v, _ := io.ReadAll(io.LimitReader(part, 1<<10))
		switch part.FormName() {
		case "model":
			model = string(v)
		case "stream":
			stream, _ = strconv.ParseBool(strings.TrimSpace(string(v)))
		case "stream_include_usage":
			usage, _ = strconv.ParseBool(strings.TrimSpace(string(v)))
		}
	}
	if audioBytes == 0 {
		return "", false, false, 0, "file is required"
	}
	return model, stream, usage, audioBytes, ""
}

// streamAudio sends the transcription as transcription.chunk events, one
// word each, then the usage when asked, then [DONE].
func (g *generation) streamAudio(t Timing, id, model string, prompt, tokens int, usage bool) {
	w, s := g.w, g.s
	if !g.wait(t.HeaderDelay) {
		return
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	g.mark(func(rec *Record) { rec.Status, rec.HeadersSent, rec.Stream = http.StatusOK, time.Now(), true })
	w.WriteHeader(http.StatusOK)
	flusher := w.(http.Flusher)
	flusher.Flush() // the headers go now, as HeadersSent says
	send := func(v any) bool {
		b, _ := json.Marshal(v)
		return g.event(b, flusher)
	}
	chunk := func(delta map[string]string, reason any) map[string]any {
		return map[string]any{"id": id, "object": "transcription.chunk", "created": s.created, "model": model,
			"choices": []map[string]any{{"delta": delta, "finish_reason": reason, "stop_reason": nil}}}
	}
	if !g.wait(t.TTFT) {
		return
	}
	for i := range tokens {
		if i > 0 && !g.wait(t.ITL) {
			return
		}
		g.markTokenEvent(time.Now(), i+1, nil)
		var reason any
		if i == tokens-1 {
			reason = "stop"
		}
		if !send(chunk(map[string]string{"content": " word"}, reason)) {
			return
		}
	}
	g.mark(func(rec *Record) { rec.PromptTokens, rec.CompletionTokens = prompt, tokens })
	if usage && !send(map[string]any{"id": id, "object": "transcription.chunk", "created": s.created, "model": model, "choices": []any{},
		"usage": map[string]int{"prompt_tokens": prompt, "completion_tokens": tokens, "total_tokens": prompt + tokens}}) {
		return
	}
	io.WriteString(w, "data: [DONE]\n\n") //nolint:errcheck
}
