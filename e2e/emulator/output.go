package emulator

import (
	"encoding/json"
	"fmt"
	"strings"
)

// What a response holds, chosen per request with HeaderOutput. Each is sent
// as vLLM sends it, streamed and not, so the two can be compared.
const (
	// OutputText is plain content, one word per token (the default).
	OutputText = "text"
	// OutputReasoning is reasoning ("reasoning_content", as vLLM's reasoning
	// parsers sent it before 0.10) for the first half of the tokens, then
	// content.
	OutputReasoning = "reasoning"
	// OutputReasoningField is OutputReasoning under both names, as newer
	// vLLM sends it: "reasoning" and "reasoning_content", alike.
	OutputReasoningField = "reasoning-field"
	// OutputTools is one tool call, its arguments spread over the events,
	// and finish reason "tool_calls" (chat only).
	OutputTools = "tools"
	// OutputUnicode is content in several scripts and emoji, with one emoji
	// sent as a surrogate pair split across two events.
	OutputUnicode = "unicode"
)

// step is what one token event carries for one choice.
type step struct {
	content   json.RawMessage // a JSON string, or nil
	reasoning json.RawMessage // a JSON string, or nil
	tool      *toolDelta
	tokens    []string // the tokens, for logprobs
}

type toolDelta struct {
	Index    int            `json:"index"`
	ID       string         `json:"id,omitempty"`
	Type     string         `json:"type,omitempty"`
	Function toolDeltaFnArg `json:"function"`
}

type toolDeltaFnArg struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// unicodeWords: one token each; the last is sent as two events of one
// surrogate half each.
var unicodeWords = []string{"héllo", "wörld", "世界", "こんにちは", "Привет", "🚀"}

// toolArguments is the tool call's arguments, one token per 4 bytes.
const toolArguments = `{"city": "Paris", "unit": "celsius", "days": 3}`

// steps splits a choice's output into events of per tokens each. Chat
// text starts without the space that separates words.
func (g *generation) steps(per int) []step {
	out := g.rawSteps(per)
	if g.api != apiCompletions {
		trimFirst := func(field func(*step) *json.RawMessage) {
			for i := range out {
				if p := field(&out[i]); *p != nil {
					if strings.HasPrefix(string(*p), `" `) {
						*p = append(json.RawMessage(`"`), (*p)[2:]...)
					}
					return
				}
			}
		}
		trimFirst(func(s *step) *json.RawMessage { return &s.content })
		trimFirst(func(s *step) *json.RawMessage { return &s.reasoning })
	}
	return out
}

func (g *generation) rawSteps(per int) []step {
	var out []step
	switch g.output {
	case OutputTools:
		out = append(out, step{tool: &toolDelta{ID: "chatcmpl-tool-" + g.e.rec.ID, Type: "function",
			Function: toolDeltaFnArg{Name: "get_weather"}}, tokens: []string{"get_weather"}})
		for i := 0; i < len(toolArguments); i += 4 * per {
			part := toolArguments[i:min(i+4*per, len(toolArguments))]
			out = append(out, step{tool: &toolDelta{Function: toolDeltaFnArg{Arguments: part}}, tokens: []string{part}})
		}
		return out
	case OutputUnicode:
		for i := 0; i < g.tokens; i += per {
			var words []string
			for j := i; j < min(i+per, g.tokens); j++ {
				words = append(words, unicodeWords[j%len(unicodeWords)])
			}
			s := " " + strings.Join(words, " ")
			if strings.HasSuffix(s, "🚀") && len(words) == 1 {
				// Split between events as two escaped halves.
				head, _ := json.Marshal(strings.TrimSuffix(s, "🚀"))
				first := append(head[:len(head)-1:len(head)-1], `\ud83d"`...)
				out = append(out, step{content: first, tokens: words}, step{content: json.RawMessage(`"\ude80"`)})
				continue
			}
			raw, _ := json.Marshal(s)
			out = append(out, step{content: raw, tokens: words})
		}
		return out
	}
	thinking := g.thinking()
	for i := 0; i < g.tokens; i += per {
		n := min(per, g.tokens-i)
		var tokens []string
		for j := i; j < i+n; j++ {
			tokens = append(tokens, words[j%len(words)])
		}
		raw, _ := json.Marshal(text(i, n))
		if i < thinking {
			out = append(out, step{reasoning: raw, tokens: tokens})
		} else {
			out = append(out, step{content: raw, tokens: tokens})
		}
	}
	return out
}

// thinking is how many of a choice's tokens are reasoning: the first half
// of the server's default output length, or all of a shorter max_tokens
// (reasoning cut by length).
func (g *generation) thinking() int {
	if g.output != OutputReasoning && g.output != OutputReasoningField {
		return 0
	}
	return min(g.timing.OutputTokens/2, g.tokens)
}

// chatLogprob is one entry of a chat choice's logprobs.content.
type chatLogprob struct {
	Token       string        `json:"token"`
	Logprob     float64       `json:"logprob"`
	Bytes       []int         `json:"bytes"`
	TopLogprobs []chatLogprob `json:"top_logprobs,omitempty"`
}

// logprobOf is a made-up but stable log probability for token i.
func logprobOf(i int) float64 { return -float64(i%7+1) / 8 }

func (g *generation) chatLogprobs(tokens []string, from int) []chatLogprob {
	out := make([]chatLogprob, len(tokens))
	for i, tok := range tokens {
		out[i] = chatLogprob{Token: tok, Logprob: logprobOf(from + i), Bytes: bytesOf(tok), TopLogprobs: []chatLogprob{}}
		for k := 0; k < g.topLogprobs; k++ {
			alt := fmt.Sprintf("%s#%d", tok, k)
			out[i].TopLogprobs = append(out[i].TopLogprobs, chatLogprob{Token: alt, Logprob: logprobOf(from+i) - float64(k), Bytes: bytesOf(alt)})
		}
	}
	return out
}

func bytesOf(s string) []int {
	b := make([]int, len(s))
	for i := 0; i < len(s); i++ {
		b[i] = int(s[i])
	}
	return b
}

// textLogprobs is a completions choice's logprobs.
type textLogprobs struct {
	TextOffset    []int                `json:"text_offset"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	Tokens        []string             `json:"tokens"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
}

// completionLogprobs covers tokens starting at token index from and text
// offset at.
func (g *generation) completionLogprobs(tokens []string, from, at int) *textLogprobs {
	lp := &textLogprobs{TextOffset: []int{}, TokenLogprobs: []float64{}, Tokens: []string{}, TopLogprobs: []map[string]float64{}}
	for i, tok := range tokens {
		tok = " " + tok
		lp.TextOffset = append(lp.TextOffset, at)
		lp.TokenLogprobs = append(lp.TokenLogprobs, logprobOf(from+i))
		lp.Tokens = append(lp.Tokens, tok)
		top := map[string]float64{tok: logprobOf(from + i)}
		for k := 1; k < g.completionTop; k++ {
			top[fmt.Sprintf("%s#%d", tok, k)] = logprobOf(from+i) - float64(k)
		}
		lp.TopLogprobs = append(lp.TopLogprobs, top)
		at += len(tok)
	}
	return lp
}
