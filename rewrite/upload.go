package rewrite

import (
	"bytes"
	"io"
	"mime/multipart"
	"strings"

	"github.com/tidwall/gjson"
)

// Transcriptions is OpenAI's audio transcriptions and translations
// (/v1/audio/transcriptions, /v1/audio/translations), as vLLM serves them:
// a multipart form with the audio file and fields beside it, answered
// with a JSON body, or, with stream=true, with an event stream of
// Chat-Completions-like chunks (choices[].delta.content, then a usage
// event). The sidecar reads the form's model and stream from the bytes
// before the file (the proxy streams the rest to the engine unread), and
// edits nothing: vLLM's schemas for them have no metrics object.
var Transcriptions API = transcriptionAPI{}

type transcriptionAPI struct{}

// maxFieldSize bounds a form field the sidecar reads (model, stream).
const maxFieldSize = 1 << 10

// InspectRequest reads a multipart form's model and stream fields from
// body, the form or its first bytes: the parts up to the first that does
// not fit in them. The boundary is the form's first line, as it is every
// multipart body's.
func (transcriptionAPI) InspectRequest(body []byte) Request {
	r := Request{Untouched: true}
	line, _, ok := bytes.Cut(body, []byte("\r\n"))
	boundary, isForm := bytes.CutPrefix(line, []byte("--"))
	if !ok || !isForm || len(boundary) == 0 || len(boundary) > 70 {
		return r // not a multipart form: forwarded as it came
	}
	r.Understood = true
	form := multipart.NewReader(bytes.NewReader(body), string(boundary))
	for {
		part, err := form.NextPart()
		if err != nil {
			return r
		}
		name := part.FormName()
		if name != "model" && name != "stream" {
			continue // a file, or a field the sidecar does not read
		}
		v, err := io.ReadAll(io.LimitReader(part, maxFieldSize+1))
		if err != nil || len(v) > maxFieldSize {
			return r
		}
		switch name {
		case "model":
			r.Model = string(v)
		case "stream":
			r.Stream, _ = boolWord(strings.TrimSpace(string(v)))
		}
	}
}

// ClassifyEvent reads a streamed transcription's chunks as Chat
// Completions' (delta.content, and a final usage event).
func (transcriptionAPI) ClassifyEvent(raw []byte) Event { return ClassifyEvent(raw) }

func (transcriptionAPI) ObserveEvent(a *Answer, ev Event) {
	if ev.Data != nil && a.ID == "" {
		s := view(ev.Data)
		a.identify(gjson.Get(s, "id"), gjson.Get(s, "model"))
	}
}

func (transcriptionAPI) ObserveBody(*Answer, []byte) {}

func (transcriptionAPI) AppendAssembled(dst []byte, _ *Assembly) ([]byte, bool) { return dst, false }
