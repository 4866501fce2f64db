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

// vLLM's pooling endpoints (vllm/entrypoints/openai/serving_{embedding,
// pooling,classification,score}.py and its rerank): one JSON request, one
// JSON answer with a usage after the emulated time of one forward pass
// (the header delay and the TTFT). Their shapes follow vLLM's, key for
// key; the numbers in them are made up.

// poolingRequest is the members the endpoints read: what they embed or
// score, and the model.
type poolingRequest struct {
	Model     string          `json:"model"`
	Input     json.RawMessage `json:"input"`     // embeddings, pooling, classify
	Text1     json.RawMessage `json:"text_1"`    // score
	Text2     json.RawMessage `json:"text_2"`    // score
	Query     json.RawMessage `json:"query"`     // rerank
	Documents json.RawMessage `json:"documents"` // rerank
}

// poolingUsage is vLLM's UsageInfo of a pooling answer.
type poolingUsage struct {
	PromptTokens        int  `json:"prompt_tokens"`
	TotalTokens         int  `json:"total_tokens"`
	CompletionTokens    int  `json:"completion_tokens"`
	PromptTokensDetails *int `json:"prompt_tokens_details"`
}

func (s *Server) pool(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	s.count(path)
	body, _ := io.ReadAll(r.Body)
	g := &generation{s: s, w: w, r: r}
	g.e = s.begin(r, body)
	defer g.finish()
	t, err := g.timingFor(r.Header)
	if err != nil {
		g.fail(http.StatusBadRequest, "BadRequestError", err.Error())
		return
	}
	if status, _ := strconv.Atoi(r.Header.Get(HeaderStatus)); status >= 400 {
		g.fail(status, "BadRequestError", fmt.Sprintf("emulated error %d", status))
		return
	}
	var req poolingRequest
	if json.Unmarshal(body, &req) != nil {
		g.fail(http.StatusBadRequest, "BadRequestError", "the request is not a JSON object")
		return
	}
	items := max(1, countItems(req.Input), countItems(req.Text2), countItems(req.Documents))
	tokens := promptTokens(req.Input, req.Text1, req.Text2, req.Query, req.Documents)
	if !g.wait(t.HeaderDelay + t.TTFT) {
		return
	}
	model := s.cfg.Model
	usage := poolingUsage{PromptTokens: tokens, TotalTokens: tokens}
	created := s.created
	var answer any
	switch {
	case path == "/v1/embeddings":
		data := make([]map[string]any, items)
		for i := range data {
			data[i] = map[string]any{"index": i, "object": "embedding", "embedding": []float64{0.0123, -0.0456, 0.0789, 0.1011}}
		}
		answer = map[string]any{"id": "embd-" + g.e.rec.ID, "object": "list", "created": created, "model": model, "data": data, "usage": usage}
	case path == "/pooling":
		data := make([]map[string]any, items)
		for i := range data {
			data[i] = map[string]any{"index": i, "object": "pooling", "data": []float64{0.25, -0.5, 0.125}}
		}
		answer = map[string]any{"id": "pool-" + g.e.rec.ID, "object": "list", "created": created, "model": model, "data": data, "usage": usage}
	case path == "/classify":
		data := make([]map[string]any, items)
		for i := range data {
			data[i] = map[string]any{"index": i, "label": "positive", "probs": []float64{0.2, 0.8}, "num_classes": 2}
		}
		answer = map[string]any{"id": "classify-" + g.e.rec.ID, "object": "list", "created": created, "model": model, "data": data, "usage": usage}
	case strings.HasSuffix(path, "/score"):
		data := make([]map[string]any, items)
		for i := range data {
			data[i] = map[string]any{"index": i, "object": "score", "score": 0.5 + 0.1*float64(i%4)}
		}
		answer = map[string]any{"id": "score-" + g.e.rec.ID, "object": "list", "created": created, "model": model, "data": data, "usage": usage}
	default: // rerank: Jina's and Cohere's shape, with only the total
		results := make([]map[string]any, items)
		for i := range results {
			results[i] = map[string]any{"index": i, "document": map[string]string{"text": "document " + strconv.Itoa(i)}, "relevance_score": 0.9 - 0.1*float64(i%8)}
		}
		answer = map[string]any{"id": "rerank-" + g.e.rec.ID, "model": model, "usage": map[string]int{"total_tokens": tokens}, "results": results}
	}
	g.mark(func(rec *Record) {
		rec.Status, rec.HeadersSent, rec.PromptTokens = http.StatusOK, time.Now(), tokens
	})
	writeJSON(w, http.StatusOK, answer)
}

// countItems is the number of inputs a member holds: the length of a
// list, or 1.
func countItems(v json.RawMessage) int {
	var list []json.RawMessage
	if json.Unmarshal(v, &list) == nil {
		return len(list)
	}
	if len(v) > 0 {
		return 1
	}
	return 0
}
