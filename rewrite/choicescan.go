package rewrite

import (
	"github.com/timing-sidecar/timing-sidecar/timing"
)

// scanChoices reads the facts of data's choices in one pass over the bytes
// up to the end of the choices, where gjson would walk the choices four
// times over (find the key, squash each choice, find its delta, iterate
// the delta): on a vLLM chunk, about a quarter of the time.
//
// It reads only the shape it can read exactly as gjson does, and says
// ok == false for anything else: data that does not open with an object,
// a key with an escape, a literal other than true, false, null or a plain
// number, or structure that is not well formed or is cut short where it
// walks. Nested values it does not read (logprobs, tool-call arguments)
// are skipped by bracket counting outside strings, as gjson skips them.
func scanChoices(data []byte) (f choiceFacts, ok bool) {
	s := scanner{b: data}
	s.space()
	if !s.take('{') {
		return f, false
	}
	s.space()
	if s.take('}') {
		return f, true // no choices
	}
	for {
		key, ok := s.key()
		if !ok {
			return f, false
		}
		if string(key) == "choices" {
			return s.choices()
		}
		if !s.skipValue() {
			return f, false
		}
		s.space()
		switch {
		case s.take(','):
		case s.take('}'):
			return f, true // no choices
		default:
			return f, false
		}
	}
}

// scanner walks JSON bytes; i is the next byte to read.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) space() {
	for s.i < len(s.b) && isSpace(s.b[s.i]) {
		s.i++
	}
}

// take consumes c if it is the next byte.
func (s *scanner) take(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

func (s *scanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// key reads `"name" :` and the space after it; an escaped name is not
// read (gjson compares it unescaped).
func (s *scanner) key() ([]byte, bool) {
	s.space()
	start, end, escaped, ok := s.str()
	if !ok || escaped {
		return nil, false
	}
	s.space()
	if !s.take(':') {
		return nil, false
	}
	s.space()
	return s.b[start:end], true
}

// str reads the string that starts at i and returns its contents' bounds
// and whether they hold a backslash. A byte loop: the strings of a chunk
// are short (keys, a token), where a call to bytes.IndexByte costs more
// than it saves.
func (s *scanner) str() (start, end int, escaped, ok bool) {
	if !s.take('"') {
		return 0, 0, false, false
	}
	start = s.i
	for i := s.i; i < len(s.b); i++ {
		switch s.b[i] {
		case '"':
			s.i = i + 1
			return start, i, escaped, true
		case '\\':
			escaped = true
			i++ // the escaped byte
		}
	}
	return 0, 0, false, false
}

// skipValue skips the value at i.
func (s *scanner) skipValue() bool {
	switch s.peek() {
	case '"':
		_, _, _, ok := s.str()
		return ok
	case '{', '[':
		return s.skipNested()
	default:
		_, ok := s.literal()
		return ok
	}
}

// skipNested skips the object or array at i by counting brackets outside
// strings.
func (s *scanner) skipNested() bool {
	depth := 0
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case '"':
			if _, _, _, ok := s.str(); !ok {
				return false
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				s.i++
				return true
			}
		case '(', ')':
			return false // gjson counts them as brackets; JSON has none
		}
		s.i++
	}
	return false
}

// literal reads true, false, null or a number, and says whether it was
// null. A literal must end where a value can: at space, ',', '}' or ']'.
func (s *scanner) literal() (isNull, ok bool) {
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		if isSpace(c) || c == ',' || c == '}' || c == ']' {
			break
		}
		s.i++
	}
	switch lit := s.b[start:s.i]; {
	case string(lit) == "null":
		return true, true
	case string(lit) == "true" || string(lit) == "false":
		return false, true
	default:
		return false, isNumber(lit)
	}
}

// isNumber tells whether lit is a JSON number.
func isNumber(lit []byte) bool {
	if len(lit) == 0 || lit[0] != '-' && (lit[0] < '0' || lit[0] > '9') {
		return false
	}
	for _, c := range lit[1:] {
		if (c < '0' || c > '9') && c != '.' && c != 'e' && c != 'E' && c != '+' && c != '-' {
			return false
		}
	}
	return lit[len(lit)-1] >= '0' && lit[len(lit)-1] <= '9'
}

// choices reads the choices array at i, to its end.
func (s *scanner) choices() (f choiceFacts, ok bool) {
	if s.peek() != '[' {
		return f, s.skipValue() // not an array: no choices to read
	}
	s.i++
	f.isArray = true
	s.space()
	if s.take(']') {
		f.empty, f.end = true, s.i
		return f, true
	}
	f.allFinished = true
	for {
		s.space()
		out, finished := timing.Output(0), false
		if s.peek() == '{' {
			if out, finished, ok = s.choice(); !ok {
				return f, false
			}
		} else if !s.skipValue() {
			return f, false
		}
		f.output |= out
		f.anyFinished = f.anyFinished || finished
		f.allFinished = f.allFinished && finished
		s.space()
		switch {
		case s.take(','):
		case s.take(']'):
			f.end = s.i
			return f, true
		default:
			return f, false
		}
	}
}

// choice reads one choice object at i as readChoice does.
func (s *scanner) choice() (out timing.Output, finished, ok bool) {
	s.i++ // '{'
	s.space()
	if s.take('}') {
		return 0, false, true
	}
	var text timing.Output
	var seenDelta, deltaObject, seenText, seenFinish bool
	for {
		key, ok := s.key()
		if !ok {
			return 0, false, false
		}
		switch {
		case string(key) == "delta" && !seenDelta:
			seenDelta, deltaObject = true, s.peek() == '{'
			if deltaObject {
				if out, ok = s.delta(); !ok {
					return 0, false, false
				}
			} else if !s.skipValue() {
				return 0, false, false
			}
		case string(key) == "text" && !seenText:
			seenText = true
			if s.peek() == '"' {
				start, end, _, ok := s.str()
				if !ok {
					return 0, false, false
				}
				if end > start {
					text = timing.OutputContent
				}
			} else if !s.skipValue() {
				return 0, false, false
			}
		case string(key) == "finish_reason" && !seenFinish:
			seenFinish = true
			switch s.peek() {
			case '"', '{', '[':
				finished = true
				if !s.skipValue() {
					return 0, false, false
				}
			default:
				isNull, ok := s.literal()
				if !ok {
					return 0, false, false
				}
				finished = !isNull
			}
		default:
			if !s.skipValue() {
				return 0, false, false
			}
		}
		s.space()
		switch {
		case s.take(','):
		case s.take('}'):
			if !deltaObject {
				out = text // a chat chunk's delta, or else a completions chunk's text
			}
			return out, finished, true
		default:
			return 0, false, false
		}
	}
}

// delta reads a chat chunk's delta object at i as deltaOutput does.
func (s *scanner) delta() (out timing.Output, ok bool) {
	s.i++ // '{'
	s.space()
	if s.take('}') {
		return 0, true
	}
	for {
		key, ok := s.key()
		if !ok {
			return 0, false
		}
		var kind timing.Output
		switch string(key) {
		case "content":
			kind = timing.OutputContent
		case "reasoning_content", "reasoning":
			kind = timing.OutputReasoning
		}
		switch c := s.peek(); {
		case kind != 0 && c == '"':
			start, end, _, ok := s.str()
			if !ok {
				return 0, false
			}
			if end > start {
				out |= kind
			}
		case string(key) == "tool_calls" && c == '[':
			start := s.i
			if !s.skipNested() {
				return 0, false
			}
			if !isEmptyArray(view(s.b[start:s.i])) {
				out |= timing.OutputContent // tool-call arguments are the answer
			}
		default:
			if !s.skipValue() {
				return 0, false
			}
		}
		s.space()
		switch {
		case s.take(','):
		case s.take('}'):
			return out, true
		default:
			return 0, false
		}
	}
}
