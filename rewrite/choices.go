package rewrite

import (
	"github.com/tidwall/gjson"

	"github.com/timing-sidecar/timing-sidecar/timing"
)

// choiceFacts is what ClassifyEvent needs of a chunk's "choices" (the
// first copy of the key at the top level of the data).
type choiceFacts struct {
	isArray bool // "choices" is there and is an array
	empty   bool // ... an array with no element
	end     int  // where the value ends in the data
	// output is what generated output the choices hold between them.
	output timing.Output
	// anyFinished: one choice has a finish_reason that is not null;
	// allFinished: every choice has one.
	anyFinished, allFinished bool
}

// choicesOf reads the facts of data's choices with gjson: the choices
// array found once, each choice's keys walked once, and its delta's keys
// once. Every event of a stream passes here; the walk allocates nothing.
func choicesOf(data []byte) choiceFacts {
	choices := gjson.Get(view(data), "choices")
	if !choices.IsArray() {
		return choiceFacts{}
	}
	f := choiceFacts{isArray: true, empty: isEmptyArray(choices.Raw), end: choices.Index + len(choices.Raw)}
	if f.empty {
		return f
	}
	f.allFinished = true
	choices.ForEach(func(_, choice gjson.Result) bool {
		out, finished := readChoice(choice)
		f.output |= out
		f.anyFinished = f.anyFinished || finished
		f.allFinished = f.allFinished && finished
		return true
	})
	return f
}

// readChoice reads one choice of a chunk in a single pass over its keys:
// what generated output it holds, content (non-empty delta content or tool
// calls, or completions text) and reasoning (non-empty delta
// reasoning_content or reasoning), and whether it has a finish reason. The
// first copy of a repeated key counts, as for gjson.Get.
func readChoice(choice gjson.Result) (out timing.Output, finished bool) {
	var text timing.Output
	var seenDelta, deltaObject, seenText, seenFinish bool
	choice.ForEach(func(key, v gjson.Result) bool {
		switch key.Str {
		case "delta":
			if !seenDelta {
				seenDelta, deltaObject = true, v.IsObject()
				if deltaObject {
					out = deltaOutput(v)
				}
			}
		case "text":
			if !seenText {
				seenText = true
				if v.Type == gjson.String && len(v.Raw) > 2 {
					text = timing.OutputContent
				}
			}
		case "finish_reason":
			if !seenFinish {
				seenFinish, finished = true, v.Type != gjson.Null
			}
		}
		return true
	})
	if !deltaObject {
		// A chat chunk's delta, or else a completions chunk's text.
		out = text
	}
	return out, finished
}

// deltaOutput reports the generated output a chat chunk's delta holds.
func deltaOutput(delta gjson.Result) timing.Output {
	var out timing.Output
	delta.ForEach(func(key, v gjson.Result) bool {
		switch key.Str {
		case "content":
			if v.Type == gjson.String && len(v.Raw) > 2 {
				out |= timing.OutputContent
			}
		case "reasoning_content", "reasoning":
			if v.Type == gjson.String && len(v.Raw) > 2 {
				out |= timing.OutputReasoning
			}
		case "tool_calls":
			// Tool-call arguments are content: the answer, not thinking.
			if v.IsArray() && !isEmptyArray(v.Raw) {
				out |= timing.OutputContent
			}
		}
		return true
	})
	return out
}
