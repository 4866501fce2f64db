package rewrite

// Events as vLLM's OpenAI server sends them (compact JSON, one data line,
// unset fields omitted), from ../shared/notes/engine-wire-format.md.
const (
	chatRole     = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1767225600,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`
	chatContent  = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1767225600,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" Hello"},"logprobs":null,"finish_reason":null}]}`
	chatMulti    = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1767225600,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" three tokens here"},"logprobs":null,"finish_reason":null}]}`
	chatFinish   = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1767225600,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}`
	chatFinishTx = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1767225600,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":"."},"logprobs":null,"finish_reason":"length","stop_reason":null}]}`
	chatReason   = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1767225600,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"reasoning_content":"Let me think"},"logprobs":null,"finish_reason":null}]}`
	chatReasonV2 = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1767225600,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"reasoning":"Hmm"},"logprobs":null,"finish_reason":null}]}`
	chatTool     = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1767225600,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"chatcmpl-tool-1","type":"function","function":{"name":"get_weather","arguments":""}}]},"logprobs":null,"finish_reason":null}]}`
	chatToolArgs = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1767225600,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\": \"Par"}}]},"logprobs":null,"finish_reason":null}]}`
	chatUsage    = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1767225600,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[],"usage":{"prompt_tokens":17,"total_tokens":27,"completion_tokens":10}}`
	chatRunning  = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1767225600,"model":"m","choices":[{"index":0,"delta":{"content":" Hi"},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":17,"total_tokens":18,"completion_tokens":1}}`
	chatN2First  = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1767225600,"model":"m","choices":[{"index":1,"delta":{"content":" B"},"logprobs":null,"finish_reason":null}]}`
	errorEvent   = `{"error":{"message":"The engine died","type":"InternalServerError","param":null,"code":500}}`
	errorFlat    = `{"object":"error","message":"The engine died","type":"InternalServerError","param":null,"code":500}`
	cmplText     = `{"id":"cmpl-1","object":"text_completion","created":1767225600,"model":"m","choices":[{"index":0,"text":" world","logprobs":null,"finish_reason":null,"stop_reason":null}]}`
	cmplEmpty    = `{"id":"cmpl-1","object":"text_completion","created":1767225600,"model":"m","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"stop","stop_reason":null}]}`
	cmplUsage    = `{"id":"cmpl-1","object":"text_completion","created":1767225600,"model":"m","choices":[],"usage":{"prompt_tokens":5,"total_tokens":12,"completion_tokens":7}}`
)

func sse(data string) string { return "data: " + data + "\n\n" }
