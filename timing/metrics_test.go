package timing

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(msec float64) time.Time { return t0.Add(time.Duration(msec * float64(time.Millisecond))) }

func count(v int64) Count { return Count{v, true} }

// streamClock builds a clock: arrival at 0, accepted, then token events.
func streamClock(accepted float64, tokens []float64, done float64) *Clock {
	c := &Clock{Arrival: at(0), Accepted: at(accepted), Done: at(done)}
	for _, tok := range tokens {
		c.MarkToken(at(tok))
	}
	return c
}

func TestCompute(t *testing.T) {
	null := Number{}
	n := func(v float64) Number { return Number{v, true} }
	tests := []struct {
		name     string
		clock    *Clock
		usage    Usage
		streamed bool
		want     Metrics
	}{{
		name:     "stream with several tokens",
		clock:    streamClock(10, []float64{60, 80, 100, 160}, 170),
		usage:    Usage{PromptTokens: count(12), CompletionTokens: count(5)},
		streamed: true,
		want: Metrics{
			TimeToFirstToken: n(50), GenerationTime: n(100), QueueTime: n(10),
			MeanITL: n(25), TokensPerSecond: n(5 / 0.150), E2ELatency: n(170), MaxITL: n(60),
			PromptTokens: count(12), CompletionTokens: count(5),
		},
	}, {
		name:     "one event carrying several tokens has no gap",
		clock:    streamClock(10, []float64{60}, 61),
		usage:    Usage{PromptTokens: count(3), CompletionTokens: count(4)},
		streamed: true,
		want: Metrics{
			TimeToFirstToken: n(50), GenerationTime: n(0), QueueTime: n(10),
			MeanITL: n(0), TokensPerSecond: n(4 / 0.050), E2ELatency: n(61), MaxITL: null,
			PromptTokens: count(3), CompletionTokens: count(4),
		},
	}, {
		name:     "single token: no mean inter-token latency",
		clock:    streamClock(5, []float64{25}, 26),
		usage:    Usage{PromptTokens: count(3), CompletionTokens: count(1)},
		streamed: true,
		want: Metrics{
			TimeToFirstToken: n(20), GenerationTime: n(0), QueueTime: n(5),
			MeanITL: null, TokensPerSecond: n(1 / 0.020), E2ELatency: n(26), MaxITL: null,
			PromptTokens: count(3), CompletionTokens: count(1),
		},
	}, {
		name:     "stream without usage: times but no token counts",
		clock:    streamClock(10, []float64{30, 40}, 45),
		streamed: true,
		want: Metrics{
			TimeToFirstToken: n(20), GenerationTime: n(10), QueueTime: n(10),
			E2ELatency: n(45), MaxITL: n(10),
		},
	}, {
		name:     "stream without tokens",
		clock:    streamClock(10, nil, 12),
		usage:    Usage{PromptTokens: count(3), CompletionTokens: count(0)},
		streamed: true,
		want: Metrics{
			QueueTime: n(10), E2ELatency: n(12),
			PromptTokens: count(3), CompletionTokens: count(0),
		},
	}, {
		name:  "non-streaming: only end-to-end figures",
		clock: &Clock{Arrival: at(0), Accepted: at(400), Done: at(400)},
		usage: Usage{PromptTokens: count(7), CompletionTokens: count(64)},
		want: Metrics{
			TokensPerSecond: n(64 / 0.400), E2ELatency: n(400),
			PromptTokens: count(7), CompletionTokens: count(64),
		},
	}, {
		name:     "marks out of order are null, not negative",
		clock:    &Clock{Arrival: at(50), Accepted: at(10), Done: at(5)},
		usage:    Usage{PromptTokens: count(1), CompletionTokens: count(2)},
		streamed: true,
		want:     Metrics{PromptTokens: count(1), CompletionTokens: count(2)},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Compute(tt.clock, tt.usage, tt.streamed)
			if !closeEnough(got, tt.want) {
				t.Errorf("Compute =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}

func closeEnough(a, b Metrics) bool {
	eq := func(x, y Number) bool {
		d := x.Value - y.Value
		return x.Set == y.Set && d < 1e-9 && d > -1e-9
	}
	return eq(a.TimeToFirstToken, b.TimeToFirstToken) && eq(a.GenerationTime, b.GenerationTime) &&
		eq(a.QueueTime, b.QueueTime) && eq(a.MeanITL, b.MeanITL) &&
		eq(a.TokensPerSecond, b.TokensPerSecond) && eq(a.E2ELatency, b.E2ELatency) &&
		eq(a.MaxITL, b.MaxITL) && a.PromptTokens == b.PromptTokens && a.CompletionTokens == b.CompletionTokens
}

func TestAppendJSON(t *testing.T) {
	m := Compute(streamClock(10, []float64{60.0005, 80}, 90), Usage{PromptTokens: count(12), CompletionTokens: Count{}}, true)
	got := string(m.AppendJSON(nil))
	want := `{"time_to_first_token_ms":50.001,"generation_time_ms":20.000,"queue_time_ms":10.000,` +
		`"mean_itl_ms":null,"tokens_per_second":null,"e2e_latency_ms":90.000,"max_itl_ms":20.000,` +
		`"prompt_tokens":12,"completion_tokens":null}`
	if got != want {
		t.Fatalf("AppendJSON =\n%s\nwant\n%s", got, want)
	}
	if !json.Valid([]byte(got)) {
		t.Fatal("AppendJSON produced invalid JSON")
	}
}

func TestAppendJSONAllocatesNothing(t *testing.T) {
	m := Compute(streamClock(10, []float64{60, 80}, 90), Usage{PromptTokens: count(12), CompletionTokens: count(2)}, true)
	buf := make([]byte, 0, 512)
	if allocs := testing.AllocsPerRun(100, func() { buf = m.AppendJSON(buf[:0]) }); allocs != 0 {
		t.Fatalf("AppendJSON allocates %v times per call, want 0", allocs)
	}
}

func TestOutputSplit(t *testing.T) {
	n := func(v float64) Number { return Number{v, true} }
	clock := func(reasoning, content []float64) *Clock {
		c := &Clock{Arrival: at(0), Accepted: at(10), Done: at(100)}
		for _, r := range reasoning {
			c.MarkOutput(at(r), OutputReasoning)
		}
		for _, x := range content {
			c.MarkOutput(at(x), OutputContent)
		}
		return c
	}
	usage := func(completion, reasoning int64, details bool) Usage {
		u := Usage{PromptTokens: count(5), CompletionTokens: count(completion)}
		if details {
			u.ReasoningTokens = count(reasoning)
		}
		return u
	}
	for _, tt := range []struct {
		name               string
		clock              *Clock
		usage              Usage
		present            bool
		reasoning, content SplitPart
	}{
		{"reasoning then content", clock([]float64{20, 30, 40}, []float64{50, 60, 70}), usage(10, 4, true), true,
			SplitPart{count(4), n(10), n(20), n(20.0 / 3), n(200)},
			SplitPart{count(6), n(40), n(20), n(4), n(300)}},
		{"reasoning only, cut by length", clock([]float64{20, 30}, nil), usage(8, 8, true), true,
			SplitPart{count(8), n(10), n(10), n(10.0 / 7), n(800)},
			SplitPart{TokenCount: count(0)}},
		{"no reasoning: no split", clock(nil, []float64{20, 30}), usage(2, 0, true), false, SplitPart{}, SplitPart{}},
		{"no completion_tokens_details: counts unknown", clock([]float64{20}, []float64{30, 40}), usage(3, 0, false), true,
			SplitPart{TimeToFirstToken: n(10), GenerationTime: n(0)},
			SplitPart{TimeToFirstToken: n(20), GenerationTime: n(10)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := Compute(tt.clock, tt.usage, true)
			if m.Split.Present != tt.present || !near(m.Split.Reasoning, tt.reasoning) || !near(m.Split.Content, tt.content) {
				t.Fatalf("split %+v", m.Split)
			}
			b := m.AppendJSON(nil)
			if tt.present != bytes.Contains(b, []byte(`"output_token_metrics":{"reasoning":{"token_count":`)) || !json.Valid(b) {
				t.Fatalf("JSON %s", b)
			}
		})
	}
}

func near(got, want SplitPart) bool {
	eq := func(a, b Number) bool { return a.Set == b.Set && math.Abs(a.Value-b.Value) < 1e-9 }
	return got.TokenCount == want.TokenCount && eq(got.TimeToFirstToken, want.TimeToFirstToken) &&
		eq(got.GenerationTime, want.GenerationTime) && eq(got.MeanITL, want.MeanITL) && eq(got.TokensPerSecond, want.TokensPerSecond)
}

// A figure with no JSON encoding goes out as null, so the object stays
// JSON whatever an engine reported.
func TestAppendJSONWritesNonFiniteAsNull(t *testing.T) {
	var m Metrics
	m.SetEngine(EngineTiming{Reported: true, Source: "vllm", QueueTime: Number{Value: math.Inf(1), Set: true}, MeanITL: Number{Value: math.NaN(), Set: true}})
	got := m.AppendJSON(nil)
	var out struct {
		Engine map[string]any `json:"engine"`
	}
	if err := json.Unmarshal(got, &out); err != nil {
		t.Fatalf("AppendJSON = %s: %v", got, err)
	}
	if q, ok := out.Engine["queue_time_ms"]; !ok || q != nil || out.Engine["mean_itl_ms"] != nil {
		t.Fatalf("engine = %v", out.Engine)
	}
}

func TestCountLateEqualsCountsKnownInTime(t *testing.T) {
	c := &Clock{Arrival: at(0), Accepted: at(10), Done: at(100)}
	c.MarkOutput(at(20), OutputReasoning)
	c.MarkOutput(at(50), OutputContent)
	c.MarkOutput(at(90), OutputContent)
	u := Usage{PromptTokens: Count{7, true}, CompletionTokens: Count{9, true}, ReasoningTokens: Count{3, true}}
	for _, streamed := range []bool{true, false} {
		late := Compute(c, Usage{}, streamed)
		if late.CompletionTokens.Set || late.TokensPerSecond.Set {
			t.Fatalf("counts before the usage came: %+v", late)
		}
		late.CountLate(c, u, streamed)
		if want := Compute(c, u, streamed); late != want {
			t.Errorf("streamed %v: late counts give\n%+v\nwant\n%+v", streamed, late, want)
		}
	}
}
