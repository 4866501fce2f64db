package compare

import (
	"strings"
	"testing"
)

const logLines = `{"time":"2026-12-07T10:00:00Z","level":"INFO","msg":"timing-sidecar listening"}
{"time":"2026-12-07T10:00:01Z","level":"INFO","msg":"request","path":"/v1/chat/completions","model":"llama","status":200,"time_to_first_token_ms":80.5,"mean_itl_ms":12,"max_itl_ms":null,"prompt_tokens":900,"completion_tokens":40,"cache":"none","upstream_error":null}
{"time":"2026-12-07T10:00:02Z","level":"INFO","msg":"request","variant":"canary","path":"/v1/chat/completions","model":"llama","status":200,"time_to_first_token_ms":70,"prompt_tokens":900,"completion_tokens":40,"cache":"none","upstream_error":null}
{"time":"2026-12-07T10:00:03Z","level":"INFO","msg":"request","path":"/v1/chat/completions","model":"llama","status":502,"time_to_first_token_ms":null,"upstream_error":"connect"}
{"time":"2026-12-07T10:00:04Z","level":"INFO","msg":"request","path":"/v1/completions","model":"llama","status":200,"time_to_first_token_ms":30,"prompt_tokens":20000,"completion_tokens":null,"upstream_error":""}
{"time":"2026-12-07T10:00:05Z","level":"INFO","msg":"request","path":"/v1/completions","model":"llama","status":200,"time_to_first_token_ms":30,"prompt_tokens":20000,"completion_tokens":null,"upstream_error":"","client_stall_ms":250}
{"time":"2026-12-07T10:00:06Z","level":"INFO","msg":"request","path":"/v1/completions","model":"llama","status":499,"time_to_first_token_ms":30,"prompt_tokens":20000,"completion_tokens":null,"upstream_error":"","client_gone":true}
not json
`

// TestReadsTheAccessLog: each request line's arm (its variant, else the
// file's), stratum and measured figures; failures counted, not dropped;
// an empty upstream_error is none; a client that stalled or left keeps
// its count, not its figures; other lines passed over; a null is no
// value.
func TestReadsTheAccessLog(t *testing.T) {
	var s Samples
	if err := s.Read(strings.NewReader(logLines), "base"); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(s.Arms(), ","); got != "base,canary" {
		t.Fatalf("arms %s", got)
	}
	if s.Requests["base"] != 5 || s.Failed["base"] != 1 || s.Requests["canary"] != 1 {
		t.Errorf("requests %v failed %v", s.Requests, s.Failed)
	}
	chat := Stratum{"/v1/chat/completions", "llama", "none", "≤1k", "≤256"}
	if v := s.Values["base"]["time_to_first_token_ms"][chat]; len(v) != 1 || v[0] != 80.5 {
		t.Errorf("base's TTFT in %v: %v (all: %v)", chat, v, s.Values["base"]["time_to_first_token_ms"])
	}
	if _, ok := s.Values["base"]["max_itl_ms"]; ok {
		t.Error("a null max_itl_ms became a value")
	}
	long := Stratum{"/v1/completions", "llama", "unknown", ">16k", "unknown"}
	if v := s.Values["base"]["time_to_first_token_ms"][long]; len(v) != 1 {
		// One: the stalled and the gone clients' figures are left out.
		t.Errorf("the long prompt's stratum: %v", s.Values["base"]["time_to_first_token_ms"])
	}
}

// TestALineTooLongIsRefused: input that is not an access log gets a
// clear error, not a read of unbounded memory.
func TestALineTooLongIsRefused(t *testing.T) {
	var s Samples
	err := s.Read(strings.NewReader(strings.Repeat("x", MaxLine+1)), "a")
	if err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Errorf("err %v", err)
	}
}
