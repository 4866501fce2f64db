// Package rewrite does the byte-level work on OpenAI-compatible bodies:
// it inspects and edits requests, frames and classifies server-sent
// events, and splices the metrics object into JSON, without decoding more
// of a document than the keys it needs. What differs between the APIs it
// reads (Chat Completions, Completions, Messages, Responses) is behind one
// interface, API, with one implementation each.
//
// It also decides what is done with those bytes, as pure functions the
// proxy carries out: a request's plan (PlanFor: what is asked of the
// engine, whether and where the metrics go) and, event by event, which
// event of a stream carries them and which waits (FinishHold).
//
// It imports timing (for the figures it reads and writes) and nothing of
// the proxy's: no network, no clock.
//
// # What the sidecar reads, and how the engine reads the same bytes
//
// The sidecar edits a request, and a response, on what it reads of the
// request, so it reads each field the way the engine does: vLLM, like
// every FastAPI engine, decodes the body with Python's json and validates
// it with pydantic models in lax mode.
//
//   - Keys are compared once their escapes are decoded: "\u0073tream" is
//     stream. Every key that could decode to one the sidecar reads is
//     decoded (maxKeyBytes says why a longer one cannot).
//   - A top-level key the sidecar reads or edits (stream, stream_options,
//     include_metrics, model, n, prompt) that comes twice leaves the request
//     unread: Python's json takes the last copy, other parsers the first or
//     refuse. Within stream_options the last copy counts, as in Python.
//   - stream, stream_options.include_usage, stream_options.
//     continuous_usage_stats and include_metrics are read as pydantic's
//     lax bool (see laxBool): true, false, 0, 1, 0.0, 1.0, "yes", "off",
//     "T", ... null is the field unset. stream_options present defaults
//     include_usage to true.
//   - A value the engine refuses (stream: "maybe", stream_options: 3,
//     n: "2", a body nested more than maxDepth deep or not a JSON object)
//     leaves the request not Understood: it goes to the engine as it came
//     and gets the engine's answer. include_metrics is the exception: the
//     sidecar removes it, so it answers a refused value itself (400).
//
// A request not Understood is forwarded byte for byte, its response passed
// on unedited, and counted as unread; the sidecar never edits on a guess.
// FuzzRequestAsTheEngineReadsIt holds InspectRequest to a model of the
// engine's reading (the emulated engine's, e2e/emulator.LaxBool).
package rewrite
