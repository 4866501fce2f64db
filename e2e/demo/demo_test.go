package demo

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
)

func TestDemoReportsBothRequests(t *testing.T) {
	var out bytes.Buffer
	err := Run(context.Background(), emulator.Timing{HeaderDelay: 5 * time.Millisecond, TTFT: 10 * time.Millisecond,
		ITL: 2 * time.Millisecond, OutputTokens: 6, TokensPerEvent: 2}, &out)
	if err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out.String())
	}
	s := out.String()
	for _, want := range []string{"streaming chat completion", "non-streaming chat completion", "time_to_first_token_ms",
		`"completion_tokens":6}`, "queue_time_ms", `"timing_sidecar": {"time_to_first_token_ms"`, `"speculative_decoding": {"mean_acceptance_length"`,
		"POST /v1/embeddings", "Server-Timing: ttfb;dur=", "answer as the engine's: true"} {
		if !strings.Contains(s, want) {
			t.Errorf("demo output lacks %q:\n%s", want, s)
		}
	}
	if strings.Count(s, `"metrics": {"time_to_first_token_ms":`) != 2 {
		t.Errorf("want two metrics objects:\n%s", s)
	}
}
