package bench

import (
	"math"
	"os"
	"path/filepath"
	"testing"
)

func TestBucketQuantile(t *testing.T) {
	bounds := []float64{0.001, 0.01, 0.1, math.Inf(1)}
	for _, tc := range []struct {
		name       string
		cumulative []float64
		q, want    float64
	}{
		{"inside the first bucket, from zero", []float64{10, 10, 10, 10}, 0.5, 0.0005},
		{"interpolated in the second", []float64{0, 10, 10, 10}, 0.5, 0.001 + 0.009*0.5},
		{"p99 in the third", []float64{50, 90, 100, 100}, 0.99, 0.01 + 0.09*0.9},
		{"past the last finite bound", []float64{0, 0, 0, 10}, 0.5, 0.1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := bucketQuantile(tc.q, bounds, tc.cumulative, tc.cumulative[len(tc.cumulative)-1])
			if math.Abs(got-tc.want) > 1e-12 && got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
	if !math.IsNaN(bucketQuantile(0.5, bounds, []float64{0, 0, 0, 0}, 0)) {
		t.Error("an empty histogram has no quantile")
	}
}

// TestParseReads counts strace's lines as the syscall figure does: every
// read on an engine connection, EAGAIN included, and the events they
// carried; the client's connection is left out.
func TestParseReads(t *testing.T) {
	dir := t.TempDir()
	thread1 := `recvmsg(7, {msg_name=NULL, msg_iov=[{iov_base="POST /v1/chat/completions HTTP/1.1\r\n", iov_len=8192}], msg_iovlen=1}, 0) = 120
recvmsg(9, {msg_name=NULL, msg_iov=[{iov_base="HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n", iov_len=4096}], msg_iovlen=1}, 0) = 60
recvmsg(9, 0xc000123456, 0) = -1 EAGAIN (Resource temporarily unavailable)
recvmsg(9, {msg_name=NULL, msg_iov=[{iov_base="9a\r\ndata: {\"choices\":[]}\n\n\r\n", iov_len=4096}], msg_iovlen=1}, 0) = 40
`
	thread2 := `read(9, 0xc000abcdef, 4096) = -1 EAGAIN (Resource temporarily unavailable)
read(9, "2a\r\ndata: one\n\ndata: two\n\n\r\n", 4096) = 30
read(7, 0xc000abcdef, 8192) = -1 EAGAIN (Resource temporarily unavailable)
`
	for name, text := range map[string]string{"t.1": thread1, "t.2": thread2} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	files, _ := filepath.Glob(filepath.Join(dir, "t.*"))
	s, err := parseReads(files)
	if err != nil {
		t.Fatal(err)
	}
	if s.Reads != 5 || s.EAGAIN != 2 || s.Events != 3 || s.ReadsPerEvent != 5.0/3 {
		t.Errorf("got %d reads (%d EAGAIN) for %d events, %.3f per event; want 5 (2) for 3", s.Reads, s.EAGAIN, s.Events, s.ReadsPerEvent)
	}
}
