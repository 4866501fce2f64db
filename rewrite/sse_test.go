package rewrite

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// chunkReader returns its chunks one Read at a time, like TCP segments.
type chunkReader struct {
	chunks [][]byte
	err    error
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.chunks) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		return 0, io.EOF
	}
	n := copy(p, r.chunks[0])
	if n == len(r.chunks[0]) {
		r.chunks = r.chunks[1:]
	} else {
		r.chunks[0] = r.chunks[0][n:]
	}
	return n, nil
}

type piece struct {
	text  string
	whole bool
}

func readAll(t *testing.T, r *EventReader) ([]piece, error) {
	t.Helper()
	var out []piece
	for {
		p, whole, err := r.Next()
		if err != nil {
			return out, err
		}
		out = append(out, piece{string(p), whole})
	}
}

func TestEventReaderSurvivesEverySplit(t *testing.T) {
	stream := sse(chatRole) + sse(chatContent) + "data: " + chatFinish + "\r\n\r\n" + sse(chatUsage) + "data: [DONE]\n\n"
	want := []string{sse(chatRole), sse(chatContent), "data: " + chatFinish + "\r\n\r\n", sse(chatUsage), "data: [DONE]\n\n"}
	for split := 0; split <= len(stream); split++ {
		for split2 := split; split2 <= len(stream); split2 += 37 {
			src := &chunkReader{chunks: [][]byte{[]byte(stream[:split]), []byte(stream[split:split2]), []byte(stream[split2:])}}
			got, err := readAll(t, NewEventReader(src, 4096))
			if err != io.EOF {
				t.Fatalf("split %d/%d: err = %v, want io.EOF", split, split2, err)
			}
			if len(got) != len(want) {
				t.Fatalf("split %d/%d: got %d events %+v, want %d", split, split2, len(got), got, len(want))
			}
			for i := range want {
				if got[i].text != want[i] || !got[i].whole {
					t.Fatalf("split %d/%d: event %d = %+v, want whole %q", split, split2, i, got[i], want[i])
				}
			}
		}
	}
}

func TestEventReaderOneByteReads(t *testing.T) {
	stream := sse(chatContent) + sse(chatUsage)
	got, err := readAll(t, NewEventReader(iotest.OneByteReader(strings.NewReader(stream)), 4096))
	if err != io.EOF || len(got) != 2 || got[0].text != sse(chatContent) || got[1].text != sse(chatUsage) {
		t.Fatalf("got %+v, %v", got, err)
	}
}

func TestEventReaderDoesNotWaitWhileAnEventIsBuffered(t *testing.T) {
	// Two events in one read, then a reader that would block forever: the
	// second event must come out without another read.
	src := io.MultiReader(strings.NewReader(sse(chatContent)+sse(chatFinish)), blockingReader{})
	r := NewEventReader(src, 4096)
	for i, want := range []string{sse(chatContent), sse(chatFinish)} {
		p, whole, err := r.Next()
		if err != nil || !whole || string(p) != want {
			t.Fatalf("event %d = %q, %v, %v", i, p, whole, err)
		}
	}
}

type blockingReader struct{}

func (blockingReader) Read([]byte) (int, error) { select {} }

func TestEventReaderLargeEventPassesIntactInPieces(t *testing.T) {
	big := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + strings.Repeat("x", 2000) + "\"}}]}\n\n"
	stream := sse(chatContent) + big + sse(chatUsage)
	for _, chunk := range []int{1, 7, 100, 4096} {
		src := &chunkReader{}
		for s := stream; len(s) > 0; {
			n := min(chunk, len(s))
			src.chunks = append(src.chunks, []byte(s[:n]))
			s = s[n:]
		}
		got, err := readAll(t, NewEventReader(src, 512))
		if err != io.EOF {
			t.Fatalf("chunk %d: err = %v", chunk, err)
		}
		var all strings.Builder
		for _, p := range got {
			all.WriteString(p.text)
		}
		if all.String() != stream {
			t.Fatalf("chunk %d: bytes changed", chunk)
		}
		first, last := got[0], got[len(got)-1]
		if !first.whole || first.text != sse(chatContent) {
			t.Errorf("chunk %d: first = %+v", chunk, first)
		}
		if !last.whole || last.text != sse(chatUsage) {
			t.Errorf("chunk %d: the event after the large one = %+v, want it whole", chunk, last)
		}
		for _, p := range got[1 : len(got)-1] {
			if p.whole && p.text != big[len(big)-len(p.text):] {
				t.Errorf("chunk %d: piece of the large event marked whole: %q", chunk, p.text)
			}
		}
	}
}

func TestEventReaderEndOfStream(t *testing.T) {
	broken := errors.New("connection reset")
	tests := []struct {
		name   string
		stream string
		err    error
		want   []piece
	}{
		{"clean end", sse(chatContent), nil, []piece{{sse(chatContent), true}}},
		{"unterminated tail is forwarded, not classified", sse(chatContent) + "data: {\"cho", nil,
			[]piece{{sse(chatContent), true}, {"data: {\"cho", false}}},
		{"error after a partial event keeps the bytes", sse(chatContent) + "data: {", broken,
			[]piece{{sse(chatContent), true}, {"data: {", false}}},
		{"empty stream", "", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := &chunkReader{chunks: [][]byte{[]byte(tt.stream)}, err: tt.err}
			got, err := readAll(t, NewEventReader(src, 4096))
			wantErr := tt.err
			if wantErr == nil {
				wantErr = io.EOF
			}
			if err != wantErr {
				t.Fatalf("err = %v, want %v", err, wantErr)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("piece %d = %+v, want %+v", i, got[i], tt.want[i])
				}
			}
		})
	}
}

func TestEventReaderReset(t *testing.T) {
	r := NewEventReader(strings.NewReader(sse(chatContent)+"data: {"), 4096)
	readAll(t, r)
	r.Reset(strings.NewReader(sse(chatUsage)))
	p, whole, err := r.Next()
	if err != nil || !whole || !bytes.Equal(p, []byte(sse(chatUsage))) {
		t.Fatalf("after Reset: %q, %v, %v", p, whole, err)
	}
}

func TestEventReaderGrowsForEventsUpToTheLimit(t *testing.T) {
	big := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + strings.Repeat("y", 10000) + "\"}}]}\n\n"
	src := &chunkReader{chunks: [][]byte{[]byte(sse(chatContent) + big[:5000]), []byte(big[5000:] + sse(chatUsage))}}
	got, err := readAll(t, NewEventReader(src, 16<<10))
	if err != io.EOF || len(got) != 3 {
		t.Fatalf("got %d pieces, %v", len(got), err)
	}
	if !got[1].whole || got[1].text != big {
		t.Fatalf("a 10 KB event under a 16 KB limit was not returned whole")
	}
	if ClassifyEvent([]byte(got[1].text)).Kind != EventToken {
		t.Fatal("large event not classified as a token")
	}
}

// TestEventReaderReady: Ready says whether Next would return without
// reading from the source.
func TestEventReaderReady(t *testing.T) {
	src := iotest.OneByteReader(strings.NewReader("data: a\n\ndata: b\n\n"))
	r := NewEventReader(src, 1024)
	if r.Ready() {
		t.Fatal("ready before anything was read")
	}
	if ev, _, _ := r.Next(); string(ev) != "data: a\n\n" || r.Ready() {
		t.Fatalf("after the first event: %q, ready %v (one byte read at a time: nothing more buffered)", ev, r.Ready())
	}
	r = NewEventReader(strings.NewReader("data: a\n\ndata: b\n\n"), 1024)
	r.Next()
	if !r.Ready() {
		t.Fatal("the second event is buffered, but not ready")
	}
	r.Next()
	r.Next() // the end
	if !r.Ready() {
		t.Fatal("not ready at the end of the stream")
	}
}

// TestLoneCRLineEndings: a stream whose lines end in a lone CR (WHATWG
// allows it) is framed event by event, however it is split into reads,
// and its events classify as their LF twins do.
func TestLoneCRLineEndings(t *testing.T) {
	token := `data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}`
	stream := token + "\r\r" + ": ping\r\r" + "data: [DONE]\r\r"
	want := []string{token + "\r\r", ": ping\r\r", "data: [DONE]\r\r"}
	for split := 1; split < len(stream); split++ {
		r := NewEventReader(&chunkReader{chunks: [][]byte{[]byte(stream[:split]), []byte(stream[split:])}}, 1024)
		var got []string
		for {
			ev, whole, err := r.Next()
			if err == io.EOF {
				break
			}
			if err != nil || !whole {
				t.Fatalf("split at %d: %q whole %v, %v", split, ev, whole, err)
			}
			got = append(got, string(ev))
		}
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Fatalf("split at %d: events %q", split, got)
		}
	}
	if ev := ClassifyEvent([]byte(want[0])); ev.Kind != EventToken || !HasDataField([]byte(want[0])) {
		t.Fatalf("a lone-CR token event classifies as %v", ev.Kind)
	}
	if ev := ClassifyEvent([]byte("event: x\rdata: [DONE]\r\r")); ev.Kind != EventDone {
		t.Fatalf("[DONE] after a lone-CR line classifies as %v", ev.Kind)
	}
}
