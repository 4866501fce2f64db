package proxy

import (
	"bufio"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
	"github.com/timing-sidecar/timing-sidecar/telemetry/requests"
)

// debugPage asks p's admin handler for /debug/requests as JSON, from
// peer.
func debugPage(t *testing.T, p *Proxy, peer, query string) (int, requests.Page) {
	t.Helper()
	r := httptest.NewRequest("GET", "/debug/requests?format=json&"+query, nil)
	r.RemoteAddr = peer
	w := httptest.NewRecorder()
	p.AdminHandler().ServeHTTP(w, r)
	var page requests.Page
	if w.Code == http.StatusOK {
		if err := json.Unmarshal(w.Body.Bytes(), &page); err != nil {
			t.Fatalf("the page's JSON: %v\n%s", err, w.Body)
		}
	}
	return w.Code, page
}

// TestDebugRequestsShowsAStall: a stream whose engine paused 300 ms after
// its third token event is on the page with its events: the longest gap
// is that pause, before the fourth token event, and no shorter than it;
// the marks are in order; the filters keep it or leave it out.
func TestDebugRequestsShowsAStall(t *testing.T) {
	engine := startEmulator(t, emulator.Config{PromptTokensDetails: true, Timing: emulator.Timing{TTFT: 5 * time.Millisecond, ITL: 2 * time.Millisecond, OutputTokens: 8}})
	p, base := startSidecar(t, engine.URL(), nil, nil)
	body := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
	resp := post(t, base+"/v1/chat/completions", body, map[string]string{emulator.HeaderStall: "3:300ms", "X-Request-Id": "stalled-1", emulator.HeaderCachedTokens: "0"})
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	code, page := debugPage(t, p, "127.0.0.1:40000", "")
	if code != http.StatusOK || len(page.Recent) != 1 {
		t.Fatalf("status %d, %d recent", code, len(page.Recent))
	}
	e := page.Recent[0]
	ev := e.Events
	if e.ID != "stalled-1" || e.Model != "m" || ev.Count < 8 || len(ev.Arrived) != ev.Count || len(ev.Written) != ev.Count {
		t.Fatalf("entry %+v", e)
	}
	// The chat stream opens with a role event: the fourth token event is
	// the fifth event.
	if ev.LongestGapMS < 300 || ev.LongestGapBefore != 4 {
		t.Errorf("longest gap %v ms before event %d; want at least 300 ms before event 4 (arrivals %v)", ev.LongestGapMS, ev.LongestGapBefore, ev.Arrived)
	}
	// In whole microseconds, as the timeline keeps them: the ms are
	// µs over 1,000, and their difference in floating point is not exact.
	if gap := math.Round(ev.Arrived[4]*1000) - math.Round(ev.Arrived[3]*1000); gap != math.Round(ev.LongestGapMS*1000) {
		t.Errorf("the kept arrivals' gap %v is not the longest gap %v", gap, ev.LongestGapMS)
	}
	for i := range ev.Arrived {
		if ev.Written[i] < ev.Arrived[i] || i > 0 && ev.Arrived[i] < ev.Arrived[i-1] {
			t.Errorf("event %d arrived %v, written %v, after %v", i, ev.Arrived[i], ev.Written[i], ev.Arrived[max(i-1, 0)])
		}
	}
	m := e.Marks
	if m.Accepted == nil || m.FirstToken == nil || m.LastToken == nil || m.Done == nil ||
		!(*m.Accepted <= *m.FirstToken && *m.FirstToken <= *m.LastToken && *m.LastToken <= *m.Done && *m.Done <= e.ElapsedMS) {
		t.Errorf("marks out of order: %+v, elapsed %v", m, e.ElapsedMS)
	}
	if string(e.Metrics) == "null" || !strings.Contains(string(e.Metrics), `"max_itl_ms"`) {
		t.Errorf("metrics %s", e.Metrics)
	}
	if e.CachedTokens == nil || *e.CachedTokens != 0 || e.Cache != "none" {
		t.Errorf("the prompt cache: %v cached tokens, class %q", e.CachedTokens, e.Cache)
	}
	for query, want := range map[string]int{"id=stalled-1": 1, "id=other": 0, "model=m&status=200": 1, "status=500": 0, "leg=whole": 1, "cache=full": 0} {
		if _, page := debugPage(t, p, "127.0.0.1:40000", query); len(page.Recent) != want {
			t.Errorf("%s: %d recent, want %d", query, len(page.Recent), want)
		}
	}
}

// TestDebugRequestsShowsARunningRequest: a request still streaming is on
// the page as running, with the last mark it passed and its events so
// far; once it ends it is among the recent ones instead.
func TestDebugRequestsShowsARunningRequest(t *testing.T) {
	engine := startEmulator(t, emulator.Config{Timing: emulator.Timing{ITL: time.Millisecond, OutputTokens: 6}})
	p, base := startSidecar(t, engine.URL(), nil, nil)
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	resp := post(t, base+"/v1/chat/completions", body, map[string]string{emulator.HeaderStall: "3:1h", "X-Request-Id": "running-1"})
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	tokens := 0
	for tokens < 3 && sc.Scan() {
		if strings.Contains(sc.Text(), `"content":"`) && !strings.Contains(sc.Text(), `"content":""`) {
			tokens++
		}
	}
	// The third token event reached the client, so the sidecar has
	// marked it: the page shows the request stopped at tokens.
	_, page := debugPage(t, p, "[::1]:40000", "")
	if len(page.Running) != 1 || len(page.Recent) != 0 {
		t.Fatalf("running %+v, recent %d", page.Running, len(page.Recent))
	}
	r := page.Running[0]
	if r.ID != "running-1" || r.Stage != "tokens" || r.Events < 3 || r.StageMS > r.ElapsedMS {
		t.Errorf("running %+v", r)
	}
	resp.Body.Close() // the client leaves; the request ends
	eventually(t, "the request ends once its client leaves", func() bool {
		_, page = debugPage(t, p, "127.0.0.1:40000", "")
		return len(page.Running) == 0 && len(page.Recent) == 1
	})
	if !page.Recent[0].ClientGone {
		t.Errorf("the ended request: %+v", page.Recent[0])
	}
}

// TestDebugRequestsAnswersLoopbackOnly: by default a peer off the
// loopback gets 403 with an OpenAI-style error; --debug-requests=any
// answers it; off, there is no page.
func TestDebugRequestsAnswersLoopbackOnly(t *testing.T) {
	engine := startEmulator(t, emulator.Config{})
	for _, c := range []struct {
		access string
		want   int
	}{{DebugLoopback, http.StatusForbidden}, {DebugAny, http.StatusOK}, {DebugOff, http.StatusNotFound}} {
		p, _ := startSidecar(t, engine.URL(), func(cfg *Config) { cfg.DebugRequests = c.access }, nil)
		r := httptest.NewRequest("GET", "/debug/requests", nil)
		r.RemoteAddr = "10.1.2.3:40000"
		w := httptest.NewRecorder()
		p.AdminHandler().ServeHTTP(w, r)
		if w.Code != c.want {
			t.Errorf("%s: %d, want %d", c.access, w.Code, c.want)
		}
		if w.Code == http.StatusForbidden && !strings.Contains(w.Body.String(), `"code":"debug_requests_loopback_only"`) {
			t.Errorf("403 body %s", w.Body)
		}
	}
}
