package upstream

import (
	"bufio"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

func TestPeekHead(t *testing.T) {
	for in, want := range map[string]string{
		"HTTP/1.1 200 OK\r\nA: 1\r\nB: 2\r\n\r\nbody": "A: 1\r\nB: 2\r\n",
		"HTTP/1.1 200 OK\nA: 1\n\nbody":               "A: 1\n",
		"HTTP/1.1 204 No Content\r\n\r\n":             "",
	} {
		got, size := peekHead(bufio.NewReader(strings.NewReader(in)))
		if got == nil || string(got) != want {
			t.Errorf("%q: fields %q, want %q", in, got, want)
		}
		if head, _, _ := strings.Cut(in, "body"); size != len(head) {
			t.Errorf("%q: head of %d bytes, want %d", in, size, len(head))
		}
	}
	// Not whole before the stream ends: nil, for the response's reader to
	// report.
	if got, _ := peekHead(bufio.NewReader(strings.NewReader("HTTP/1.1 200 OK\r\nA: 1\r\n"))); got != nil {
		t.Errorf("an unfinished block: %q, want nil", got)
	}
}

// A response that arrived whole in one read is found in the buffer, not
// waited past: the engine sends nothing more on a kept-alive connection.
func TestPeekHeadDoesNotWaitPastAWholeResponse(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	go io.WriteString(a, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}") //nolint:errcheck
	b.SetReadDeadline(time.Now().Add(5 * time.Second))                     //nolint:errcheck // a wait fails, not hangs
	if got, _ := peekHead(bufio.NewReader(b)); string(got) != "Content-Length: 2\r\n" {
		t.Fatalf("fields %q", got)
	}
}
