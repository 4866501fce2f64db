package emulator

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"testing"
	"time"
)

// TestSilentClientsBlockTheirStreams: streams whose clients read
// nothing, each asking for a huge max_tokens, must each cost the engine a
// fixed amount of memory. The generation blocks on the connection (TCP
// backpressure) instead of producing the output ahead of the client.
func TestSilentClientsBlockTheirStreams(t *testing.T) {
	const (
		streams = 48 // a dozen on each streaming API
		// maxTokens is large enough that output made ahead of the client
		// shows (the code before the fix held about 360 bytes per token
		// and stream, 1.7 GB in all here), small enough that such code
		// fails this test without exhausting the machine.
		maxTokens = 100_000
		// perStream is the heap a stalled stream may hold: its connection,
		// request, record and buffers, measured at 8 to 20 KiB. The bound
		// leaves a wide margin and is under a hundredth of what output
		// made ahead took (36 MiB a stream).
		perStream = 256 << 10
	)
	// No pacing: each stream runs until the connection is full. Small
	// socket buffers make that a few KiB, whatever the system's defaults.
	s := New(Config{MaxModelLen: 1 << 30})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.ln = smallBuffers{ln}
	go s.srv.Serve(s.ln) //nolint:errcheck // ends with Close
	t.Cleanup(func() { s.Close() })
	apis := []struct{ path, prefix, body string }{
		{"/v1/chat/completions", "chatcmpl-", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":%d}`},
		{"/v1/completions", "cmpl-", `{"model":"m","prompt":"hi","stream":true,"max_tokens":%d}`},
		{"/v1/messages", "msg_", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":%d}`},
		{"/v1/responses", "resp_", `{"model":"m","input":"hi","stream":true,"max_tokens":%d}`},
	}
	goroutines := runtime.NumGoroutine()
	heap := liveHeap()

	ids := make([]string, streams)
	conns := make([]net.Conn, streams)
	for i := range conns {
		api := apis[i%len(apis)]
		requestID := fmt.Sprint("silent-", i)
		ids[i] = api.prefix + requestID
		conns[i] = sendOnly(t, s.ln.Addr().String(), api.path, fmt.Sprintf(api.body, maxTokens), requestID)
	}
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})

	// Every stream has sent a token: output made ahead would exist by now.
	// Then let them run until none advances (each blocked on its full
	// connection) or for a bounded time; the bound holds either way.
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	deadline := time.Now().Add(2 * time.Minute)
	for started, _, _ := progress(s, ids); started < streams; started, _, _ = progress(s, ids) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d streams sent a token", started, streams)
		}
		<-poll.C
	}
	settle := time.Now().Add(10 * time.Second)
	for last, still := -1, 0; still < 10 && time.Now().Before(settle); <-poll.C {
		_, events, _ := progress(s, ids)
		if events == last {
			still++
		} else {
			last, still = events, 0
		}
	}
	grown := liveHeap() - heap
	_, events, done := progress(s, ids)
	t.Logf("%d streams, %d token events sent, heap grew %d KiB (%d KiB per stream)", streams, events, grown>>10, grown/streams>>10)
	if done > 0 {
		t.Errorf("%d streams finished although no client read", done)
	}
	if grown > streams*perStream {
		t.Errorf("heap grew %d MiB for %d stalled streams, want under %d MiB", grown>>20, streams, streams*perStream>>20)
	}

	// The clients leave: each stream sees it and ends, and nothing stays.
	for _, c := range conns {
		c.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, id := range ids {
		rec, err := s.Wait(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.ClientGone.IsZero() {
			t.Errorf("%s: the engine did not see its client leave", rec.ID)
		}
	}
	deadline = time.Now().Add(time.Minute)
	for n := runtime.NumGoroutine(); n > goroutines; n = runtime.NumGoroutine() {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines left, %d before the streams", n, goroutines)
		}
		<-poll.C
	}
}

// smallBuffers accepts connections with a small kernel send buffer.
type smallBuffers struct{ net.Listener }

func (l smallBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(socketBuffer) //nolint:errcheck // a larger buffer only slows the test
	}
	return c, err
}

// socketBuffer is the kernel buffer asked for each side of a silent stream.
const socketBuffer = 16 << 10

// sendOnly sends a request on a new connection and never reads.
func sendOnly(t *testing.T, addr, path, body, id string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.(*net.TCPConn).SetReadBuffer(socketBuffer) //nolint:errcheck // a larger buffer only slows the test
	if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: emulator\r\nContent-Type: application/json\r\n%s: %s\r\nContent-Length: %d\r\n\r\n%s",
		path, HeaderRequestID, id, len(body), body); err != nil {
		t.Fatal(err)
	}
	return c
}

// progress is how many of the requests ids have sent a token, their token
// events in all, and how many are done.
func progress(s *Server, ids []string) (started, events, done int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		e := s.records[id]
		if e == nil {
			continue
		}
		if !e.rec.FirstToken.IsZero() {
			started++
		}
		events += e.rec.TokenEvents
		if !e.rec.Done.IsZero() {
			done++
		}
	}
	return started, events, done
}

// liveHeap is the bytes of live heap objects after a collection.
func liveHeap() int {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int(m.HeapAlloc)
}
