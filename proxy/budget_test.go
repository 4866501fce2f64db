package proxy

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/timing-sidecar/timing-sidecar/proxy/membudget"
)

// TestSlowUploadersHoldWhatTheySent: a client that declares a large body
// and trickles it holds room in --max-body-memory for what it has sent
// (at most twice that, as the room doubles, until an eighth has come),
// not for what it declared, so that two such clients leave the rest of the
// budget to a large request beside them, which is read and measured.
func TestSlowUploadersHoldWhatTheySent(t *testing.T) {
	engine := newFakeEngine(t)
	const declared, sent = 64_000_000, 3 << 19 // 1.5 MiB sent of 64 MB
	p, base := startSidecar(t, engine.URL(), nil, nil)
	prefix := `{"model":"m","messages":[{"role":"user","content":"`
	for range 2 {
		c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s%s",
			declared, prefix, strings.Repeat("a", sent-len(prefix)))
	}
	// Both bodies' bytes are in the sidecar's room (the reads have no
	// event to wait on).
	eventually(t, "the uploads read", func() bool { return p.bodies.Used() >= 2*sent })
	if used := p.bodies.Used(); used > 2*2*sent {
		t.Fatalf("two uploads of %d bytes so far hold %d bytes of the budget", sent, used)
	}

	body := `{"model":"m","stream":true,"include_metrics":true,"messages":[{"role":"user","content":"` + strings.Repeat("b", 40_000_000) + `"}]}`
	resp := post(t, base+"/v1/chat/completions", body, nil)
	events, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(events), `"metrics"`) {
		t.Fatalf("status %d, the large request beside the uploads was not measured: %.300s", resp.StatusCode, events)
	}
	if fr := engine.next(t); string(fr.Body) == body {
		t.Fatal("the large request went to the engine unread")
	}
	if n := counterValue(t, p, "timing_sidecar_unread_requests_total", map[string]string{"reason": "no_memory"}); n != 0 {
		t.Fatalf("%v requests unread for memory", n)
	}
}

// TestHeldAnswersKeepTheirRoomUntilWritten: a large non-streaming answer
// the sidecar splices into is held until the client has read it, and its
// room in --max-body-memory is held as long: a client that does not read
// cannot make the budget count less than the sidecar holds.
func TestHeldAnswersKeepTheirRoomUntilWritten(t *testing.T) {
	const size = 12 << 20 // more than loopback's socket buffers hold
	answer := `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		strings.Repeat("x", size) + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(answer), answer)
	})
	p, base := startSidecar(t, engine.URL(), nil, nil)
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"model":"m","include_metrics":true}`
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	// The handler has returned (the request is recorded) and the answer
	// waits on the client, who reads nothing yet.
	eventually(t, "the request recorded", func() bool {
		return counterValue(t, p, "timing_sidecar_requests_total", map[string]string{"endpoint": "chat_completions", "stream": "false", "status": "200", "model": "m"}) == 1
	})
	if used := p.bodies.Used(); used < size {
		t.Fatalf("the budget counts %d bytes while the sidecar holds a %d-byte answer for its client", used, size)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(got[len(got)-2000:]), `"metrics":{`) || len(got) < size {
		t.Fatalf("status %d, %d bytes, no metrics", resp.StatusCode, len(got))
	}
	eventually(t, "the room given back", func() bool { return p.bodies.Used() == 0 })
}

// TestUnreadBodiesGiveBackTheirRoomOnceSent: what was read of a body that
// then streams through unread gives its room back as soon as those bytes
// have gone to the engine, not when the client's upload ends.
func TestUnreadBodiesGiveBackTheirRoomOnceSent(t *testing.T) {
	p := &Proxy{bodies: membudget.New(1 << 20), log: slog.New(slog.DiscardHandler)}
	f := &flight{}
	read := []byte(strings.Repeat("a", 64<<10))
	p.bodies.Charge(len(read))
	f.bodyTaken = len(read)
	rest, more := io.Pipe()
	p.streamUnread(f, read, rest, 2*len(read))
	got := make([]byte, len(read))
	if _, err := io.ReadFull(f.unread, got); err != nil {
		t.Fatal(err)
	}
	if used := p.bodies.Used(); used != 0 {
		t.Fatalf("%d bytes still held once what was read went on", used)
	}
	go more.Write(read) //nolint:errcheck
	if _, err := io.ReadFull(f.unread, got); err != nil {
		t.Fatal(err)
	}
	p.sent(f) // given once
	if used := p.bodies.Used(); used != 0 {
		t.Fatalf("budget at %d after the request", used)
	}
}
