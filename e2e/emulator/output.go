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

// stepper makes a choice's output one step (one token event) at a time, as
// the events go out, so a stream holds the same memory whatever its
// max_tokens. Chat text starts without the space that separates words.
type stepper struct {
	g   *generation
	per int // tokens per step
	// at is the next token, or for a tool call the next byte of its
	// arguments once the step naming the function is made.
	at        int
	named     bool  // the tool call's first step, with its name, is made
	emojiHalf *step // the second half of an emoji split across two events, due next
	// trimContent and trimReasoning: the first content and the first
	// reasoning are still to come, with their leading space to drop.
	trimContent, trimReasoning bool
}

func (g *generation) stepper(per int) *stepper {
	trim := g.api != apiCompletions
	return &stepper{g: g, per: per, trimContent: trim, trimReasoning: trim}
}

// more tells whether a step is left.
func (s *stepper) more() bool {
	switch {
	case s.emojiHalf != nil:
		return true
	case s.g.output == OutputTools:
		return !s.named || s.at < len(toolArguments)
	}
	return s.at < s.g.tokens
}

// next makes the next step; call it while more is true.
func (s *stepper) next() step {
	st := s.make()
	trim := func(p *json.RawMessage, pending *bool) {
		if *p == nil || !*pending {
			return
		}
		*pending = false
		if strings.HasPrefix(string(*p), `" `) {
			*p = append(json.RawMessage(`"`), (*p)[2:]...)
		}
	}
	trim(&st.content, &s.trimContent)
	trim(&st.reasoning, &s.trimReasoning)
	return st
}

func (s *stepper) make() step {
	g, per := s.g, s.per
	if st := s.emojiHalf; st != nil {
		s.emojiHalf = nil
		return *st
	}
	switch g.output {
	case OutputTools:
		if !s.named {
			s.named = true
			return step{tool: &toolDelta{ID: "chatcmpl-tool-" + g.e.rec.ID, Type: "function",
				Function: toolDeltaFnArg{Name: "get_weather"}}, tokens: []string{"get_weather"}}
		}
		part := toolArguments[s.at:min(s.at+4*per, len(toolArguments))]
		s.at += 4 * per
		return step{tool: &toolDelta{Function: toolDeltaFnArg{Arguments: part}}, tokens: []string{part}}
	case OutputUnicode:
		i := s.at
		s.at += per
		var picked []string
		for j := i; j < min(i+per, g.tokens); j++ {
			picked = append(picked, unicodeWords[j%len(unicodeWords)])
		}
		piece := " " + strings.Join(picked, " ")
		if strings.HasSuffix(piece, "🚀") && len(picked) == 1 {
			// Split between events as two escaped halves.
			head, _ := json.Marshal(strings.TrimSuffix(piece, "🚀"))
			s.emojiHalf = &step{content: json.RawMessage(`"\ude80"`)}
			return step{content: append(head[:len(head)-1:len(head)-1], `\ud83d"`...), tokens: picked}
		}
		raw, _ := json.Marshal(piece)
		return step{content: raw, tokens: picked}
	}
	i := s.at
	n := min(per, g.tokens-i)
	s.at += per
	tokens := make([]string, n)
	for j := range tokens {
		tokens[j] = words[(i+j)%len(words)]
	}
	raw, _ := json.Marshal(text(i, n))
	if i < g.thinking() {
		return step{reasoning: raw, tokens: tokens}
	}
	return step{content: raw, tokens: tokens}
}

// steps is a choice's whole output, for the responses that hold it all.
func (g *generation) steps(per int) []step {
	var out []step
	for s := g.stepper(per); s.more(); {
		out = append(out, s.next())
	}
	return out
}

// outputText is the text of a choice's whole output, as a client joins
// it, made again step by step without keeping the steps.
func (g *generation) outputText(per int) string {
	var raw []byte
	for s := g.stepper(per); s.more(); {
		if c := s.next().content; c != nil {
			raw = append(raw, c[1:len(c)-1]...)
		}
	}
	return decodeString(raw)
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
