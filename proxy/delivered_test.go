package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// answerEnd is one API's stream, its final event last, and the bytes in
// that event a client stops reading at.
type answerEnd struct {
	path, body string
	events     []string
	final      string
}

var answerEnds = map[string]answerEnd{
	"chat completions, [DONE]": {"/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`,
		[]string{roleEvent, tokenEvent("a"), shapeEvent(0, `{}`, "", "stop", ""),
			`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[]` + shapeUsage + "}\n\n", "data: [DONE]\n\n"},
		"data: [DONE]"},
	"responses, response.completed": {"/v1/responses", `{"model":"m","stream":true,"input":"hi"}`,
		[]string{"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"a\"}\n\n",
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"status\":\"completed\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1,\"total_tokens\":4}}}\n\n"},
		`"type":"response.completed"`},
	"messages, message_stop": {"/v1/messages", `{"model":"m","max_tokens":5,"stream":true,"messages":[]}`,
		[]string{"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"m\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}\n\n",
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":1}}\n\n",
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"},
		`"type":"message_stop"`},
}

// TestAnAnswerDeliveredIsNotADisconnect: a client that closes its
// connection as soon as it has the stream's final event (openai-python
// closes its response at [DONE], the chunked terminator unread) was served
// in full. Its request is complete in the access log, the disconnect
// counter and the usage record, whether the engine's end of the stream
// came before the close or after the sidecar noticed it (here the engine
// holds it until the sidecar lets go of its connection, so every request
// meets that order). Many at once, for each API's final event.
func TestAnAnswerDeliveredIsNotADisconnect(t *testing.T) {
	const clients, each = 8, 6
	for name, api := range answerEnds {
		for _, engineWaits := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s, engine waits %v", name, engineWaits), func(t *testing.T) {
				engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
					defer c.Close()
					var b strings.Builder
					b.WriteString(sseHead)
					for _, e := range api.events {
						b.WriteString(chunk(e))
					}
					io.WriteString(c, b.String())
					if engineWaits {
						// Until the sidecar closes the connection, or long past
						// when it would have.
						c.SetReadDeadline(time.Now().Add(10 * time.Second))
						io.Copy(io.Discard, c)
					}
					io.WriteString(c, "0\r\n\r\n")
				})
				recv := newCEReceiver(t)
				var log syncBuffer
				p, base := startSidecar(t, engine.URL(), usageConfig(t.TempDir(), recv.srv.URL), &log)
				var wg sync.WaitGroup
				for range clients {
					wg.Go(func() {
						for range each {
							readToTheEndAndClose(t, base, api)
						}
					})
				}
				wg.Wait()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				p.Shutdown(ctx)

				lines := log.lines()
				if len(lines) != clients*each {
					t.Fatalf("%d log lines, want %d", len(lines), clients*each)
				}
				for _, line := range lines {
					var rec struct {
						Status     int    `json:"status"`
						ClientGone bool   `json:"client_gone"`
						Upstream   string `json:"upstream_error"`
					}
					json.Unmarshal([]byte(line), &rec)
					if rec.Status != 200 || rec.ClientGone || rec.Upstream != "" {
						t.Fatalf("a request whose final event was delivered is logged as %s", line)
					}
				}
				if n := counterValue(t, p, "timing_sidecar_client_disconnects_total", nil); n != 0 {
					t.Errorf("%v client disconnects counted, want 0", n)
				}
				for id, rec := range recv.byRequest(t) {
					if rec.Data["end"] != "completed" {
						t.Fatalf("usage record of %s: end %v, want completed", id, rec.Data["end"])
					}
				}
			})
		}
	}
}

// readToTheEndAndClose sends the stream's request on a connection of its
// own, reads until the final event has arrived whole, and closes.
func readToTheEndAndClose(t *testing.T, base string, api answerEnd) {
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Error(err)
		return
	}
	defer c.Close()
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: sidecar\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", api.path, len(api.body), api.body)
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	var got []byte
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if i := bytes.Index(got, []byte(api.final)); i >= 0 && bytes.Contains(got[i:], []byte("\n\n")) {
			return
		}
		if err != nil {
			t.Errorf("the stream ended before its final event: %v\n%s", err, got)
			return
		}
	}
}
