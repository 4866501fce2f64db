package e2e

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
)

// TestAttacksLeaveTheProcessServing sends the release binary, one after
// another, the requests that once took it down or held its memory: invalid
// UTF-8 in labels, deeply nested JSON, megabyte model names, a smuggled
// request, bodies over the limit. The process must answer each, keep
// serving, and give its memory back. Each attack's own outcome is checked
// by its test in proxy/ (the README's Guarantees table names them).
func TestAttacksLeaveTheProcessServing(t *testing.T) {
	t.Parallel() // its own processes: beside the other long tests, not after them
	engine := startEngine(t, emulator.Config{})
	sc := startSidecar(t, []string{"--upstream", engine.URL(), "--admin-pprof", "--access-log=false",
		"--tenant-header", "X-Tenant", "--tenant-label"})
	post := func(body []byte, header ...string) int {
		req, _ := http.NewRequest("POST", sc.base+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("the sidecar did not answer: %v", err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	post([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)) // warm up
	collectGarbage(t, sc.admin)
	base := readGauges(t, sc.admin)

	// Invalid UTF-8 in the model and the tenant, streaming or not.
	for _, body := range []string{"{\"model\":\"m\xff\",\"messages\":[]}", "{\"model\":\"m\xff\",\"stream\":true,\"messages\":[]}"} {
		post([]byte(body), "X-Tenant", "t\xfe")
	}
	// Nested JSON: four 8 MB bodies at once, then one of 12 MB.
	nested := func(depth int) []byte {
		return []byte(`{"model":"m","messages":` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + `}`)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { post(nested(4 << 20)) })
	}
	wg.Wait()
	post(nested(6 << 20))
	// Model names of a megabyte each.
	for i := range 40 {
		post([]byte(`{"model":"` + strings.Repeat(string(rune('a'+i%26)), 1<<20) + `","messages":[]}`))
	}
	// A request smuggled in a body the sidecar would read as empty.
	c, err := net.Dial("tcp", strings.TrimPrefix(sc.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != 400 {
		t.Fatalf("smuggling: %v %v, want a 400", resp, err)
	}
	c.Close()
	// Bodies over the 64 MiB limit.
	for range 2 {
		if status := post(make([]byte, 65<<20)); status != 413 {
			t.Fatalf("over the limit: status %d", status)
		}
	}

	if status := post([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)); status != 200 {
		t.Fatalf("after the attacks: status %d", status)
	}
	resp, err = http.Get(sc.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	exposition, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if len(exposition) > 4<<20 {
		t.Fatalf("/metrics is %d MB after the attacks", len(exposition)>>20)
	}
	var now adminGauges
	deadline := time.Now().Add(20 * time.Second)
	for {
		collectGarbage(t, sc.admin)
		now = readGauges(t, sc.admin)
		if now.goroutines <= base.goroutines+2 && now.heapInuse <= base.heapInuse+8<<20 && now.rss <= base.rss+64<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not back to baseline: goroutines %v (was %v), heap in use %.1f MB (was %.1f), RSS %.1f MB (was %.1f)",
				now.goroutines, base.goroutines, now.heapInuse/(1<<20), base.heapInuse/(1<<20), now.rss/(1<<20), base.rss/(1<<20))
		}
		time.Sleep(50 * time.Millisecond) // polling gauges: there is no event to await
	}
	t.Logf("after the attacks: goroutines %v (baseline %v), heap in use %.1f MB (%.1f), RSS %.1f MB (%.1f), /metrics %d KB",
		now.goroutines, base.goroutines, now.heapInuse/(1<<20), base.heapInuse/(1<<20), now.rss/(1<<20), base.rss/(1<<20), len(exposition)>>10)
	if now.panics != 0 {
		t.Fatalf("%v panics", now.panics)
	}
}
