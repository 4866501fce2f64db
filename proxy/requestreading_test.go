package proxy

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
	"github.com/timing-sidecar/timing-sidecar/rewrite"
)

// TestRequestsAreReadAsTheEngineReadsThem: requests whose fields the
// engine reads with its own rules (escaped keys of any length, pydantic's
// lax booleans) get, through the sidecar, exactly the events the engine
// sends a direct client, with the metrics where they belong; and a value
// the engine refuses reaches the engine as the client wrote it.
func TestRequestsAreReadAsTheEngineReadsThem(t *testing.T) {
	engine := startEmulator(t, emulator.Config{Timing: emulator.Timing{TTFT: 5 * time.Millisecond, OutputTokens: 3}})
	optIn := startProxy(t, engine.URL(), nil)
	always := startProxy(t, engine.URL(), func(c *Config) { c.Mode = rewrite.ModeAlways })
	// "stream_options" with every letter escaped: longer than any bound a
	// reader might put on the keys it unescapes.
	escapedOptions := `"\u0073\u0074\u0072\u0065\u0061\u006d\u005f\u006f\u0070\u0074\u0069\u006f\u006e\u0073"`
	const msgs = `"model":"m","messages":[{"role":"user","content":"hi"}]`
	for _, tt := range []struct {
		name, base, body string
		metrics          bool // the client gets a metrics object
	}{
		{"escaped stream_options asking for usage", optIn,
			`{` + msgs + `,"stream":true,` + escapedOptions + `:{"include_usage":true},"include_metrics":true}`, true},
		{"include_usage 0 with metrics always", always, `{` + msgs + `,"stream":true,"stream_options":{"include_usage":0}}`, true},
		{`include_usage "no", opted in`, optIn, `{` + msgs + `,"stream":true,"stream_options":{"include_usage":"no"},"include_metrics":1}`, true},
		{`include_metrics "yes"`, optIn, `{` + msgs + `,"stream":true,"include_metrics":"yes"}`, true},
		{`include_metrics "off"`, optIn, `{` + msgs + `,"stream":true,"include_metrics":"off"}`, false},
		{`stream "on"`, optIn, `{` + msgs + `,"stream":"on","include_metrics":true}`, true},
		{`stream "0", not a stream`, optIn, `{` + msgs + `,"stream":"0","include_metrics":true}`, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			direct := strings.ReplaceAll(tt.body, `"include_metrics"`, `"not_read"`) // the emulator ignores unknown fields
			want := engineEvents(t, engine.URL(), direct)
			got := engineEvents(t, tt.base, tt.body)
			if len(got) != len(want) {
				t.Fatalf("%d events through the sidecar, %d direct:\n%s\n---\n%s", len(got), len(want),
					strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			carried := 0
			for i := range got {
				if gjson.Get(got[i], "metrics").Exists() {
					carried++
				}
				usage := func(s string) bool { return gjson.Get(s, "usage").Exists() }
				if usage(got[i]) != usage(want[i]) || gjson.Get(got[i], "choices.#").Int() != gjson.Get(want[i], "choices.#").Int() {
					t.Fatalf("event %d through the sidecar %s, direct %s", i, got[i], want[i])
				}
			}
			if (carried == 1) != tt.metrics || carried > 1 {
				t.Fatalf("%d events carry metrics, want metrics %v:\n%s", carried, tt.metrics, strings.Join(got, "\n"))
			}
		})
	}

	t.Run("a value the engine refuses reaches it as written", func(t *testing.T) {
		for _, body := range []string{
			`{` + msgs + `,"stream":"nope","include_metrics":true}`,
			`{` + msgs + `,"stream":true,"stream_options":{"include_usage":2},"include_metrics":true}`,
		} {
			resp := post(t, always+"/v1/chat/completions", body, nil)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			rec, err := engine.Last(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 400 || string(rec.Body) != body {
				t.Fatalf("status %d; the engine got %s, want the client's %s", resp.StatusCode, rec.Body, body)
			}
		}
	})
}

// engineEvents posts body and returns the data of each event of the
// answer (a non-streaming answer is one).
func engineEvents(t *testing.T, base, body string) []string {
	t.Helper()
	resp := post(t, base+"/v1/chat/completions", body, nil)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if !isSSE(resp.Header.Get("Content-Type")) {
		b, _ := io.ReadAll(resp.Body)
		return []string{string(b)}
	}
	events, err := readEvents(t, resp.Body)
	if err != nil && err != io.EOF {
		t.Fatal(err)
	}
	data := make([]string, len(events))
	for i, e := range events {
		data[i] = e.data
	}
	return data
}

func isSSE(contentType string) bool { return strings.HasPrefix(contentType, "text/event-stream") }
