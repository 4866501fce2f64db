package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
)

// audioForm is a multipart transcription request: the fields, then a
// file of size bytes, as OpenAI's SDKs send them.
func audioForm(t *testing.T, size int, fields ...string) (string, []byte) {
	t.Helper()
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	for i := 0; i+1 < len(fields); i += 2 {
		w.WriteField(fields[i], fields[i+1]) //nolint:errcheck
	}
	fw, _ := w.CreateFormFile("file", "speech.wav")
	fw.Write(bytes.Repeat([]byte("RIFF"), size/4)) //nolint:errcheck
	w.Close()
	return w.FormDataContentType(), b.Bytes()
}

func postForm(t *testing.T, url, contentType, id string, body []byte) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", url, bytes.NewReader(body))
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("X-Request-Id", id)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestAudioUploadsAreMeasured: transcriptions and translations, streamed
// and not, are measured from the form's fields before the file, which
// streams to the engine unread and untouched; a streamed one gets its
// first-token and inter-token figures and the usage's counts.
func TestAudioUploadsAreMeasured(t *testing.T) {
	engine := startEmulator(t, emulator.Config{Model: "whisper", Timing: emulator.Timing{HeaderDelay: 5 * time.Millisecond,
		TTFT: 20 * time.Millisecond, ITL: 5 * time.Millisecond, OutputTokens: 6}})
	var log syncBuffer
	p, base := startSidecar(t, engine.URL(), nil, &log)
	for _, tc := range []struct {
		name, path string
		size       int
		fields     []string
		model      string
		stream     bool
	}{
		{"a large upload", "/v1/audio/transcriptions", 1 << 20, []string{"model", "whisper", "language", "en"}, "whisper", false},
		{"a small one", "/v1/audio/transcriptions", 2 << 10, []string{"model", "whisper"}, "whisper", false},
		{"streamed, with usage", "/v1/audio/translations", 256 << 10, []string{"model", "whisper", "stream", "true", "stream_include_usage", "true"}, "whisper", true},
		{"no model field", "/v1/audio/transcriptions", 64 << 10, nil, "", false},
	} {
		ct, body := audioForm(t, tc.size, tc.fields...)
		id := strings.ReplaceAll(tc.name, " ", "-")
		direct := postForm(t, engine.URL()+tc.path, ct, id, body)
		want, _ := io.ReadAll(direct.Body)
		direct.Body.Close()
		resp := postForm(t, base+tc.path, ct, id, body)
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		rec, err := engine.Last(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", tc.name, resp.StatusCode, got)
		}
		// The engine read the whole file (its made-up tokens are its KiB).
		if rec.PromptTokens != max(1, tc.size/1024) {
			t.Errorf("%s: the engine read %d KiB of the %d KiB file", tc.name, rec.PromptTokens, tc.size/1024)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: answer changed:\n got %.300s\nwant %.300s", tc.name, got, want)
		}
		p.telemetry.Flush()
		lines := log.lines()
		checkAudioLogLine(t, tc.name, lines[len(lines)-1], tc.model, tc.stream, len(body))
		if used := p.bodies.Used(); used != 0 {
			t.Errorf("%s: %d bytes of the budget still held", tc.name, used)
		}
	}
	checkAudioSeries(t, p)
}

// checkAudioLogLine checks the access-log line of the upload named name:
// its model, whether it streamed, a latency, the bytes it sent, bytesIn,
// and for a stream its first-token and inter-token figures and the
// emulator's 6 completion tokens.
func checkAudioLogLine(t *testing.T, name, last, model string, stream bool, bytesIn int) {
	t.Helper()
	var e struct {
		Model      string   `json:"model"`
		Stream     bool     `json:"stream"`
		E2E        *float64 `json:"e2e_latency_ms"`
		TTFT       *float64 `json:"time_to_first_token_ms"`
		ITL        *float64 `json:"mean_itl_ms"`
		Completion *int     `json:"completion_tokens"`
		BytesIn    int      `json:"bytes_in"`
	}
	if err := json.Unmarshal([]byte(last), &e); err != nil {
		t.Fatal(err)
	}
	if e.Model != model || e.Stream != stream || e.E2E == nil || e.BytesIn != bytesIn {
		t.Errorf("%s: logged %s", name, last)
	}
	if stream && (e.TTFT == nil || e.ITL == nil || e.Completion == nil || *e.Completion != 6) {
		t.Errorf("%s: stream figures missing: %s", name, last)
	}
}

// checkAudioSeries checks the series TestAudioUploadsAreMeasured's
// uploads left: none unread, each timed by endpoint and model, and the
// streamed translation's first token.
func checkAudioSeries(t *testing.T, p *Proxy) {
	t.Helper()
	if got := counterValue(t, p, "timing_sidecar_unread_requests_total", map[string]string{"reason": "no_memory"}); got != 0 {
		t.Errorf("uploads counted as unread: %v", got)
	}
	for _, c := range []struct {
		endpoint, model string
		n               uint64
	}{{"transcriptions", "whisper", 2}, {"transcriptions", "", 1}, {"translations", "whisper", 1}} {
		l := map[string]string{"endpoint": c.endpoint, "model": c.model}
		if got, _ := histogramCount(t, p, "timing_sidecar_e2e_request_latency_seconds", l); got != c.n {
			t.Errorf("e2e count%v = %d, want %d", l, got, c.n)
		}
	}
	if got, _ := histogramCount(t, p, "timing_sidecar_time_to_first_token_seconds", map[string]string{"endpoint": "translations", "model": "whisper", "cache": "unknown"}); got != 1 {
		t.Errorf("translations TTFT count %d", got)
	}
}

// TestAudioUploadWithoutRoom: with no room in the budget even for the
// form's fields, an upload streams to the engine unread, is answered, and
// is timed and counted as unread.
func TestAudioUploadWithoutRoom(t *testing.T) {
	engine := startEmulator(t, emulator.Config{Model: "whisper", Timing: emulator.Timing{TTFT: 5 * time.Millisecond, OutputTokens: 2}})
	var log syncBuffer
	p, base := startSidecar(t, engine.URL(), func(c *Config) { c.MaxBodyMemory = 8 << 10 }, &log)
	ct, body := audioForm(t, 512<<10, "model", "whisper")
	start := time.Now()
	resp := postForm(t, base+"/v1/audio/transcriptions", ct, "no-room", body)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(got), `"text"`) {
		t.Fatalf("%d %s", resp.StatusCode, got)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Errorf("the upload waited %v for room that could not come", waited)
	}
	p.telemetry.Flush()
	lines := log.lines()
	if last := lines[len(lines)-1]; !strings.Contains(last, `"e2e_latency_ms":`) || strings.Contains(last, `"e2e_latency_ms":null`) {
		t.Errorf("logged %s", last)
	}
	if got := counterValue(t, p, "timing_sidecar_unread_requests_total", map[string]string{"reason": "no_memory"}); got != 1 {
		t.Errorf("unread no_memory = %v, want 1", got)
	}
	if used := p.bodies.Used(); used != 0 {
		t.Errorf("%d bytes of the budget still held", used)
	}
}
