package emulator

import "encoding/json"

// The JSON shapes of vLLM's OpenAI server, field for field and in its key
// order, so the sidecar and clients see what a real engine sends.

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	TotalTokens      int `json:"total_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	// CompletionTokensDetails is sent for OutputReasoning only, so both
	// shapes of usage are exercised.
	CompletionTokensDetails *tokenDetails `json:"completion_tokens_details,omitempty"`
	// PromptTokensDetails is sent with Config.PromptTokensDetails.
	PromptTokensDetails *promptDetails `json:"prompt_tokens_details,omitempty"`
}

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
	// CreatedCacheTokens is vLLM's count of the prompt tokens it computed
	// and wrote to its prefix cache: whole blocks of 16.
	CreatedCacheTokens int `json:"created_cache_tokens"`
}

type tokenDetails struct {
	ReasoningTokens int `json:"reasoning_tokens"`
}

type chatDelta struct {
	Role             string          `json:"role,omitempty"`
	Content          json.RawMessage `json:"content,omitempty"`
	ReasoningContent json.RawMessage `json:"reasoning_content,omitempty"`
	Reasoning        json.RawMessage `json:"reasoning,omitempty"`
	ToolCalls        []toolDelta     `json:"tool_calls,omitempty"`
}

type chatChunkChoice struct {
	Index        int       `json:"index"`
	Delta        chatDelta `json:"delta"`
	Logprobs     any       `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
	// StopReason is sent (as null) only with the finish reason.
	StopReason json.RawMessage `json:"stop_reason,omitempty"`
}

type completionChunkChoice struct {
	Index        int             `json:"index"`
	Text         json.RawMessage `json:"text"` // raw: half a surrogate pair stays as sent
	Logprobs     any             `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
	StopReason   *string         `json:"stop_reason"`
}

type chunk struct {
	ID      string          `json:"id"`
	Object  string          `json:"object"`
	Created int64           `json:"created"`
	Model   string          `json:"model"`
	Choices any             `json:"choices"`
	Usage   *usage          `json:"usage,omitempty"`
	Metrics json.RawMessage `json:"metrics,omitempty"`
}

type chatMessage struct {
	Role         string     `json:"role"`
	Content      *string    `json:"content"` // null when the message is only tool calls
	Refusal      *string    `json:"refusal"`
	Annotations  *struct{}  `json:"annotations"`
	Audio        *struct{}  `json:"audio"`
	FunctionCall *struct{}  `json:"function_call"`
	ToolCalls    []toolCall `json:"tool_calls"`
	// ReasoningContent is null without reasoning, as vLLM sends it;
	// omitted when the reasoning goes in Reasoning (the newer name).
	ReasoningContent json.RawMessage `json:"reasoning_content,omitempty"`
	Reasoning        *string         `json:"reasoning,omitempty"`
}

type toolCall struct {
	ID       string         `json:"id"`
	Type     string         `json:"type"`
	Function toolDeltaFnArg `json:"function"`
}

type chatChoice struct {
	Index        int         `json:"index"`
	Message      chatMessage `json:"message"`
	Logprobs     any         `json:"logprobs"`
	FinishReason string      `json:"finish_reason"`
	StopReason   *string     `json:"stop_reason"`
}

type completionChoice struct {
	Index          int       `json:"index"`
	Text           string    `json:"text"`
	Logprobs       any       `json:"logprobs"`
	FinishReason   string    `json:"finish_reason"`
	StopReason     *string   `json:"stop_reason"`
	PromptLogprobs *struct{} `json:"prompt_logprobs"`
}

type completion struct {
	ID                string          `json:"id"`
	Object            string          `json:"object"`
	Created           int64           `json:"created"`
	Model             string          `json:"model"`
	Choices           any             `json:"choices"`
	ServiceTier       *string         `json:"service_tier,omitempty"`
	SystemFingerprint *string         `json:"system_fingerprint,omitempty"`
	Usage             usage           `json:"usage"`
	PromptLogprobs    *struct{}       `json:"prompt_logprobs,omitempty"`
	Metrics           json.RawMessage `json:"metrics,omitempty"`
	KVTransferParams  json.RawMessage `json:"kv_transfer_params,omitempty"`
}

// apiError is vLLM's error body, also sent as an in-stream error event.
type apiError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	} `json:"error"`
}

func newAPIError(status int, typ, message string) apiError {
	var e apiError
	e.Error.Message, e.Error.Type, e.Error.Code = message, typ, status
	return e
}

// engineMetrics is vLLM's per-request metrics object.
type engineMetrics struct {
	TimeToFirstToken float64  `json:"time_to_first_token_ms"`
	GenerationTime   float64  `json:"generation_time_ms"`
	QueueTime        float64  `json:"queue_time_ms"`
	MeanITL          *float64 `json:"mean_itl_ms"`
	TokensPerSecond  float64  `json:"tokens_per_second"`
	// Spec is vLLM 0.28's speculative decoding report, in the same object.
	Spec *specDecoding `json:"speculative_decoding,omitempty"`
}

// specDecoding is vLLM's per-request speculative decoding report.
type specDecoding struct {
	MeanAcceptanceLength   float64 `json:"mean_acceptance_length"`
	DraftAcceptanceRate    float64 `json:"draft_acceptance_rate"`
	AcceptanceHistogram    []int   `json:"acceptance_histogram"`
	NumSpecSteps           int     `json:"num_spec_steps"`
	NumAcceptedDraftTokens int     `json:"num_accepted_draft_tokens"`
	NumDraftTokens         int     `json:"num_draft_tokens"`
	NumSpecTokens          int     `json:"num_spec_tokens"`
	// PerStep is the detailed form's accepted draft tokens at each step.
	PerStep []int `json:"per_step_accepted_tokens,omitempty"`
}
