// Package rewrite does the byte-level work on OpenAI-compatible bodies:
// it inspects and edits requests, frames and classifies server-sent
// events, and splices the metrics object into JSON, without decoding more
// of a document than the keys it needs. What differs between the APIs it
// reads (Chat Completions, Completions, Messages, Responses) is behind one
// interface, API, with one implementation each.
package rewrite
