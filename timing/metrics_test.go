package timing

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
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
		// The reviewer's case: vLLM's formula would say 90 ms, above every gap.
		name:     "completion_tokens fewer than the token events: figures over the events",
		clock:    streamClock(10, []float64{60, 70, 80, 90, 100, 110, 120, 130, 140, 150}, 160),
		usage:    Usage{PromptTokens: count(3), CompletionTokens: count(2)},
		streamed: true,
		want: Metrics{
			TimeToFirstToken: n(50), GenerationTime: n(90), QueueTime: n(10),
			MeanITL: n(10), TokensPerSecond: n(10 / 0.140), E2ELatency: n(160), MaxITL: n(10),
			PromptTokens: count(3), CompletionTokens: count(2), TokenEvents: count(10),
		},
	}, {
		name:     "several tokens an event: vLLM's mean, below the largest event gap",
		clock:    streamClock(10, []float64{60, 80, 100, 160}, 170),
		usage:    Usage{CompletionTokens: count(12)},
		streamed: true,
		want: Metrics{
			TimeToFirstToken: n(50), GenerationTime: n(100), QueueTime: n(10),
			MeanITL: n(100.0 / 11), TokensPerSecond: n(12 / 0.150), E2ELatency: n(170), MaxITL: n(60),
			CompletionTokens: count(12),
		},
	}, {
		name:     "completion_tokens equal to the token events: vLLM's figures",
		clock:    streamClock(10, []float64{60, 80, 100, 160}, 170),
		usage:    Usage{CompletionTokens: count(4)},
		streamed: true,
		want: Metrics{
			TimeToFirstToken: n(50), GenerationTime: n(100), QueueTime: n(10),
			MeanITL: n(100.0 / 3), TokensPerSecond: n(4 / 0.150), E2ELatency: n(170), MaxITL: n(60),
			CompletionTokens: count(4),
		},
	}, {
		// Not 0 tokens/s for a stream that sent output.
		name:     "completion_tokens 0 with token events: figures over the events",
		clock:    streamClock(10, []float64{60, 80}, 90),
		usage:    Usage{CompletionTokens: count(0)},
		streamed: true,
		want: Metrics{
			TimeToFirstToken: n(50), GenerationTime: n(20), QueueTime: n(10),
			MeanITL: n(20), TokensPerSecond: n(2 / 0.070), E2ELatency: n(90), MaxITL: n(20),
			CompletionTokens: count(0), TokenEvents: count(2),
		},
	}, {
		// Null would read as a one-token answer, which has no ITL to judge.
		name:     "completion_tokens 1 with several token events: a mean over the events",
		clock:    streamClock(10, []float64{30, 40, 60}, 70),
		usage:    Usage{CompletionTokens: count(1)},
		streamed: true,
		want: Metrics{
			TimeToFirstToken: n(20), GenerationTime: n(30), QueueTime: n(10),
			MeanITL: n(15), TokensPerSecond: n(3 / 0.050), E2ELatency: n(70), MaxITL: n(20),
			CompletionTokens: count(1), TokenEvents: count(3),
		},
	}, {
		name:     "one token event, completion_tokens 0: a rate of one, no mean",
		clock:    streamClock(10, []float64{60}, 70),
		usage:    Usage{CompletionTokens: count(0)},
		streamed: true,
		want: Metrics{
			TimeToFirstToken: n(50), GenerationTime: n(0), QueueTime: n(10),
			TokensPerSecond: n(1 / 0.050), E2ELatency: n(70),
			CompletionTokens: count(0), TokenEvents: count(1),
		},
	}, {
		name:  "non-streaming: the engine's count, with no events to check it against",
		clock: &Clock{Arrival: at(0), Accepted: at(400), Done: at(400)},
		usage: Usage{CompletionTokens: count(0)},
		want:  Metrics{TokensPerSecond: n(0), E2ELatency: n(400), CompletionTokens: count(0)},
	}, {
		name:     "marks out of order are null, not negative",
		clock:    &Clock{Arrival: at(50), Accepted: at(10), Done: at(5)},
		usage:    Usage{PromptTokens: count(1), CompletionTokens: count(2)},
		streamed: true,
		want:     Metrics{PromptTokens: count(1), CompletionTokens: count(2)},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Compute(tt.clock, tt.usage, tt.streamed, EngineTiming{})
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
		eq(a.MaxITL, b.MaxITL) && a.PromptTokens == b.PromptTokens && a.CompletionTokens == b.CompletionTokens &&
		a.TokenEvents == b.TokenEvents
}

func TestAppendJSON(t *testing.T) {
	m := Compute(streamClock(10, []float64{60.0005, 80}, 90), Usage{PromptTokens: count(12), CompletionTokens: Count{}}, true, EngineTiming{})
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
	m := Compute(streamClock(10, []float64{60, 80}, 90), Usage{PromptTokens: count(12), CompletionTokens: count(2)}, true, EngineTiming{})
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
			part(count(4), n(10), n(20), n(20.0/3), n(200)),
			part(count(6), n(40), n(20), n(4), n(300))},
		{"reasoning only, cut by length", clock([]float64{20, 30}, nil), usage(8, 8, true), true,
			part(count(8), n(10), n(10), n(10.0/7), n(800)),
			SplitPart{TokenCount: count(0)}},
		{"content count 0 with content events: figures over the events", clock([]float64{20, 30}, []float64{50, 90}), usage(4, 4, true), true,
			part(count(4), n(10), n(10), n(10.0/3), n(400)),
			SplitPart{TokenCount: count(0), TimeToFirstToken: n(40), GenerationTime: n(40), MeanITL: n(40), TokensPerSecond: n(50), TokenEvents: count(2)}},
		{"reasoning count fewer than its events: figures over the events", clock([]float64{20, 30, 40, 50}, []float64{60, 70}), usage(10, 2, true), true,
			SplitPart{TokenCount: count(2), TimeToFirstToken: n(10), GenerationTime: n(30), MeanITL: n(10), TokensPerSecond: n(4 / 0.030), TokenEvents: count(4)},
			part(count(8), n(50), n(10), n(10.0/7), n(800))},
		{"no reasoning: no split", clock(nil, []float64{20, 30}), usage(2, 0, true), false, SplitPart{}, SplitPart{}},
		{"no completion_tokens_details: counts unknown", clock([]float64{20}, []float64{30, 40}), usage(3, 0, false), true,
			SplitPart{TimeToFirstToken: n(10), GenerationTime: n(0)},
			SplitPart{TimeToFirstToken: n(20), GenerationTime: n(10)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := Compute(tt.clock, tt.usage, true, EngineTiming{})
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

func part(tokens Count, ttft, gen, mean, rate Number) SplitPart {
	return SplitPart{TokenCount: tokens, TimeToFirstToken: ttft, GenerationTime: gen, MeanITL: mean, TokensPerSecond: rate}
}

func near(got, want SplitPart) bool {
	eq := func(a, b Number) bool { return a.Set == b.Set && math.Abs(a.Value-b.Value) < 1e-9 }
	return got.TokenCount == want.TokenCount && got.TokenEvents == want.TokenEvents && eq(got.TimeToFirstToken, want.TimeToFirstToken) &&
		eq(got.GenerationTime, want.GenerationTime) && eq(got.MeanITL, want.MeanITL) && eq(got.TokensPerSecond, want.TokensPerSecond)
}

// A figure with no JSON encoding goes out as null, so the object stays
// JSON whatever an engine reported.
func TestAppendJSONWritesNonFiniteAsNull(t *testing.T) {
	m := Metrics{Engine: EngineTiming{Reported: true, Source: "vllm", QueueTime: Number{Value: math.Inf(1), Set: true}, MeanITL: Number{Value: math.NaN(), Set: true}}}
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
		late := Compute(c, Usage{}, streamed, EngineTiming{})
		if late.CompletionTokens.Set || late.TokensPerSecond.Set {
			t.Fatalf("counts before the usage came: %+v", late)
		}
		late.CountLate(c, u, streamed)
		if want := Compute(c, u, streamed, EngineTiming{}); late != want {
			t.Errorf("streamed %v: late counts give\n%+v\nwant\n%+v", streamed, late, want)
		}
	}
}

// mean_itl_ms ≤ max_itl_ms, compared exactly: with the engine's count short
// of the events the mean would exceed every gap, and with counts that agree
// a mean divided after scaling to ms could exceed the largest gap by a unit
// in the last place.
func TestMeanITLAtMostMaxITL(t *testing.T) {
	even := func(n int, gap time.Duration) *Clock {
		c := &Clock{Arrival: t0, Accepted: t0.Add(time.Millisecond)}
		for i := range n {
			c.MarkToken(c.Accepted.Add(time.Duration(i+1) * gap))
		}
		c.Done = c.LastToken
		return c
	}
	for _, tt := range []struct {
		name   string
		clock  *Clock
		tokens int64
	}{
		{"completion_tokens 2 after 10 events 10 ms apart", even(10, 10*time.Millisecond), 2},
		{"completion_tokens 0 after 3 events", even(3, 7*time.Millisecond), 0},
		{"even gaps of 1.095028 ms, counts agree: rounding stays at the gap", even(10, 1095028*time.Nanosecond), 10},
		{"even gaps of 1.095028 ms, one token short of the events", even(22, 1095028*time.Nanosecond), 21},
		{"uneven gaps, completion_tokens 2", streamClock(10, []float64{20, 21, 24, 29, 36}, 40), 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := Compute(tt.clock, Usage{CompletionTokens: count(tt.tokens)}, true, EngineTiming{})
			if !m.MeanITL.Set || !m.MaxITL.Set || m.MeanITL.Value > m.MaxITL.Value {
				t.Errorf("mean_itl_ms %+v, max_itl_ms %+v: want both, the mean at most the max", m.MeanITL, m.MaxITL)
			}
		})
	}
}

// Counts that come after the metrics went out give the record what they
// would have given in time, including null where an earlier count made a
// figure.
func TestCountLateReplacesEarlierFigures(t *testing.T) {
	reasoned := &Clock{Arrival: at(0), Accepted: at(10), Done: at(100)}
	reasoned.MarkOutput(at(20), OutputReasoning)
	reasoned.MarkOutput(at(50), OutputContent)
	for _, tt := range []struct {
		name        string
		clock       *Clock
		early, late Usage
	}{
		{"a late count of one leaves no mean from an earlier count", streamClock(10, []float64{60}, 70),
			Usage{CompletionTokens: count(5)}, Usage{CompletionTokens: count(1)}},
		{"a late count short of the events says so", streamClock(10, []float64{60, 70, 80}, 90),
			Usage{CompletionTokens: count(5)}, Usage{CompletionTokens: count(2)}},
		{"a late count that covers the events drops token_events", streamClock(10, []float64{60, 70, 80}, 90),
			Usage{CompletionTokens: count(1)}, Usage{CompletionTokens: count(3)}},
		{"a late split without details leaves no figures from earlier ones", reasoned,
			Usage{CompletionTokens: count(6), ReasoningTokens: count(2)}, Usage{CompletionTokens: count(6)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := Compute(tt.clock, tt.early, true, EngineTiming{})
			got.CountLate(tt.clock, tt.late, true)
			if want := Compute(tt.clock, tt.late, true, EngineTiming{}); got != want {
				t.Errorf("late counts give\n%+v\nwant\n%+v", got, want)
			}
		})
	}
}

// The object says which count its per-token figures are over, and only
// when it is not the engine's.
func TestAppendJSONSaysWhichCount(t *testing.T) {
	c := &Clock{Arrival: at(0), Accepted: at(10), Done: at(100)}
	c.MarkOutput(at(20), OutputReasoning)
	c.MarkOutput(at(30), OutputReasoning)
	c.MarkOutput(at(40), OutputContent)
	m := Compute(c, Usage{PromptTokens: count(5), CompletionTokens: count(2), ReasoningTokens: count(1)}, true, EngineTiming{})
	got := string(m.AppendJSON(nil))
	want := `{"time_to_first_token_ms":10.000,"generation_time_ms":20.000,"queue_time_ms":10.000,` +
		`"mean_itl_ms":10.000,"tokens_per_second":100.000,"e2e_latency_ms":100.000,"max_itl_ms":10.000,` +
		`"prompt_tokens":5,"completion_tokens":2,"token_events":3,"output_token_metrics":{` +
		`"reasoning":{"token_count":1,"time_to_first_token_ms":10.000,"generation_time_ms":10.000,"mean_itl_ms":10.000,"tokens_per_second":200.000,"token_events":2},` +
		`"content":{"token_count":1,"time_to_first_token_ms":30.000,"generation_time_ms":0.000,"mean_itl_ms":null,"tokens_per_second":null}}}`
	if got != want {
		t.Fatalf("AppendJSON =\n%s\nwant\n%s", got, want)
	}
}

// FuzzPerTokenFigures checks the per-token figures against the marks and
// counts they come from, for any marks and counts: see checkPerToken.
// gaps are the steps between token events in units of unit (negative: out
// of order), kinds each event's Output, cycled.
func FuzzPerTokenFigures(f *testing.F) {
	steps := func(n int, g byte) []byte { return bytes.Repeat([]byte{g}, n) }
	f.Add(steps(10, 10), []byte{1}, uint32(time.Millisecond), int16(50), int64(2), true, int64(0), false, true)              // the reviewer's case
	f.Add(steps(10, 1), []byte{1}, uint32(1095028), int16(3), int64(10), true, int64(0), false, true)                        // rounding, counts agree
	f.Add(steps(4, 20), []byte{1}, uint32(time.Millisecond), int16(5), int64(0), true, int64(0), false, true)                // count 0
	f.Add([]byte{5, 250, 30, 1, 0, 0}, []byte{1}, uint32(time.Millisecond), int16(5), int64(3), true, int64(0), false, true) // out of order
	f.Add([]byte{3, 7, 1, 40, 2, 9}, []byte{2, 2, 3, 1}, uint32(333333), int16(4), int64(4), true, int64(3), true, true)     // a split, counts short
	f.Add([]byte{3, 7, 1}, []byte{2, 1}, uint32(time.Millisecond), int16(4), int64(9), true, int64(12), true, true)          // reasoning above completion
	f.Add([]byte{3, 7, 1}, []byte{1}, uint32(time.Millisecond), int16(-4), int64(1), true, int64(0), false, true)            // accepted before arrival
	f.Add([]byte{}, []byte{}, uint32(time.Millisecond), int16(4), int64(7), true, int64(0), false, false)                    // not streamed
	f.Add(steps(6, 9), []byte{1}, uint32(time.Millisecond), int16(4), int64(math.MaxInt64), true, int64(0), false, true)
	f.Fuzz(func(t *testing.T, gaps, kinds []byte, unit uint32, accepted int16, completion int64, completionSet bool, reasoning int64, reasoningSet bool, streamed bool) {
		if completion < 0 || reasoning < 0 {
			return // not a Count: rewrite leaves a count below zero unset
		}
		c := fuzzClock(gaps, kinds, max(1, time.Duration(unit%5_000_000)), accepted)
		u := Usage{PromptTokens: count(1), CompletionTokens: Count{completion, completionSet}, ReasoningTokens: Count{reasoning, reasoningSet}}
		checkPerToken(t, c, u, streamed)
	})
}

// The property over random inputs in every run, beyond the fuzz seeds.
func TestPerTokenFiguresOverRandomInputs(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		gaps, kinds := make([]byte, r.IntN(20)), make([]byte, 1+r.IntN(4))
		for i := range gaps {
			gaps[i] = byte(r.IntN(256))
		}
		for i := range kinds {
			kinds[i] = byte(r.IntN(4))
		}
		c := fuzzClock(gaps, kinds, time.Duration(1+r.IntN(3_000_000)), int16(r.IntN(200)-20))
		n := func() Count { return Count{int64(r.IntN(len(gaps) + 3)), r.IntN(8) != 0} }
		checkPerToken(t, c, Usage{CompletionTokens: n(), ReasoningTokens: n()}, r.IntN(6) != 0)
		if t.Failed() {
			return
		}
	}
}

func fuzzClock(gaps, kinds []byte, unit time.Duration, accepted int16) *Clock {
	c := &Clock{Arrival: t0, Accepted: t0.Add(time.Duration(accepted) * unit)}
	now := c.Accepted
	for i, g := range gaps[:min(len(gaps), 64)] {
		now = now.Add(time.Duration(int8(g)) * unit)
		out := OutputContent
		if len(kinds) > 0 {
			out = Output(kinds[i%len(kinds)] & 3)
		}
		c.MarkOutput(now, out)
	}
	c.Done = now.Add(unit)
	return c
}

// checkPerToken checks the rule of perTokenCount on one input:
//   - mean_itl_ms ≤ max_itl_ms whenever both are set, in the struct and in
//     the JSON;
//   - one count for all of an object's per-token figures: token_events
//     when set, else completion_tokens (a part's token_count), and it is
//     at least the events; mean = generation / (count − 1) and the rate =
//     count / its interval, so mean × (count − 1) + TTFT = count / rate;
//   - token_events set exactly when the engine's count is short of the
//     events; no figure without a count; none negative or not finite;
//   - counts that come late give what they would have given in time.
func checkPerToken(t *testing.T, c *Clock, u Usage, streamed bool) {
	t.Helper()
	k := perTokenCheck{t: t, c: c, u: u, streamed: streamed, m: Compute(c, u, streamed, EngineTiming{})}
	k.figuresFinite()
	k.meanNotAboveMax()
	k.topLevel()
	k.split()
	k.encoded()
	k.countedLate()
}

// perTokenCheck is one input of checkPerToken and the metrics computed
// from it; its methods each check one part of the rule.
type perTokenCheck struct {
	t        *testing.T
	c        *Clock
	u        Usage
	streamed bool
	m        Metrics
}

// fail reports a broken rule with the input and the metrics.
func (k *perTokenCheck) fail(format string, args ...any) {
	k.t.Helper()
	k.t.Errorf("events %d, usage %+v, streamed %v: "+format+"\nmetrics %+v", append([]any{k.c.tokenEvents, k.u, k.streamed}, append(args, k.m)...)...)
}

// figuresFinite: no figure is negative or not finite.
func (k *perTokenCheck) figuresFinite() {
	k.t.Helper()
	m := k.m
	for _, x := range []Number{m.TimeToFirstToken, m.GenerationTime, m.QueueTime, m.MeanITL, m.TokensPerSecond, m.E2ELatency, m.MaxITL,
		m.Split.Reasoning.GenerationTime, m.Split.Reasoning.MeanITL, m.Split.Reasoning.TokensPerSecond,
		m.Split.Content.GenerationTime, m.Split.Content.MeanITL, m.Split.Content.TokensPerSecond} {
		if x.Set && (x.Value < 0 || math.IsNaN(x.Value) || math.IsInf(x.Value, 0)) {
			k.fail("figure %v", x.Value)
		}
	}
}

// meanNotAboveMax: mean_itl_ms ≤ max_itl_ms whenever both are set.
func (k *perTokenCheck) meanNotAboveMax() {
	k.t.Helper()
	if k.m.MeanITL.Set && k.m.MaxITL.Set && k.m.MeanITL.Value > k.m.MaxITL.Value {
		k.fail("mean_itl_ms %v > max_itl_ms %v", k.m.MeanITL.Value, k.m.MaxITL.Value)
	}
}

// topLevel checks the top level's per-token figures when streamed, and
// that there are none of the streamed kind when not.
func (k *perTokenCheck) topLevel() {
	k.t.Helper()
	m, c := k.m, k.c
	if k.streamed {
		decode := number(span(m.from(c), c.LastToken))
		if c.tokenEvents == 0 {
			decode = Number{}
		}
		k.object(perTokenObject{"top level", m.CompletionTokens, m.TokenEvents, c.tokenEvents, m.GenerationTime, decode, m.TimeToFirstToken, m.MeanITL, m.TokensPerSecond})
	} else if m.TokenEvents.Set || m.MeanITL.Set {
		k.fail("not streamed: token_events or a mean")
	}
}

// split checks each part's per-token figures when the output is split.
func (k *perTokenCheck) split() {
	k.t.Helper()
	if !k.m.Split.Present {
		return
	}
	for _, p := range []struct {
		what string
		p    SplitPart
		s    Span
	}{{"reasoning", k.m.Split.Reasoning, k.c.Reasoning}, {"content", k.m.Split.Content, k.c.Content}} {
		// A part's rate is over its own generation time, with no TTFT in it.
		k.object(perTokenObject{p.what, p.p.TokenCount, p.p.TokenEvents, p.s.events, p.p.GenerationTime, p.p.GenerationTime, Number{0, true}, p.p.MeanITL, p.p.TokensPerSecond})
	}
}

// perTokenObject is one object's per-token figures and what they come
// from: the engine's count, the token_events used instead, the events
// seen, and the interval the rate is over.
type perTokenObject struct {
	what                       string
	engine, used               Count
	events                     int
	gen, rate, ttft, mean, tps Number
}

// object checks one object's per-token figures against one count.
func (k *perTokenCheck) object(o perTokenObject) {
	k.t.Helper()
	what, engine, used, events := o.what, o.engine, o.used, o.events
	if used.Set != (engine.Set && k.streamed && events > 0 && engine.Value < int64(events)) || used.Set && used.Value != int64(events) {
		k.fail("%s: token_events %+v with the engine's count %+v and %d events", what, used, engine, events)
	}
	n := engine
	if used.Set {
		n = used
	}
	if !n.Set && (o.mean.Set || o.tps.Set) {
		k.fail("%s: a per-token figure without a count", what)
	}
	k.meanAndRate(what, n, o)
}

// meanAndRate checks an object's mean and rate against its count n: mean
// = generation / (n − 1), rate = n / its interval, and so mean × (n − 1) +
// TTFT = n / rate.
func (k *perTokenCheck) meanAndRate(what string, n Count, o perTokenObject) {
	k.t.Helper()
	gen, rate, ttft, mean, tps := o.gen, o.rate, o.ttft, o.mean, o.tps
	if mean.Set && (n.Value <= 1 || !gen.Set || !relEqual(mean.Value*float64(n.Value-1), gen.Value)) {
		k.fail("%s: mean_itl_ms %v is not generation %+v / (%d − 1)", what, mean.Value, gen, n.Value)
	}
	if tps.Set && (!rate.Set || !relEqual(1000*float64(n.Value)/tps.Value, rate.Value)) && n.Value != 0 {
		k.fail("%s: tokens_per_second %v is not %d over %+v ms", what, tps.Value, n.Value, rate)
	}
	if mean.Set && tps.Set && ttft.Set && n.Value > 1 && !relEqual(mean.Value*float64(n.Value-1)+ttft.Value, 1000*float64(n.Value)/tps.Value) {
		k.fail("%s: mean %v × (%d − 1) + TTFT %v ≠ %d / %v tokens/s", what, mean.Value, n.Value, ttft.Value, n.Value, tps.Value)
	}
}

// relEqual reports whether a equals b within a relative 1e-9.
func relEqual(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

// encoded checks the JSON the metrics encode to: mean_itl_ms ≤ max_itl_ms,
// and token_events present exactly when set.
func (k *perTokenCheck) encoded() {
	k.t.Helper()
	b := k.m.AppendJSON(nil)
	var js struct {
		Mean        *float64 `json:"mean_itl_ms"`
		Max         *float64 `json:"max_itl_ms"`
		TokenEvents *int64   `json:"token_events"`
	}
	if err := json.Unmarshal(b, &js); err != nil {
		k.fail("JSON %s: %v", b, err)
		return
	}
	if js.Mean != nil && js.Max != nil && *js.Mean > *js.Max {
		k.fail("JSON %s: mean_itl_ms above max_itl_ms", b)
	}
	if (js.TokenEvents != nil) != k.m.TokenEvents.Set {
		k.fail("JSON %s: token_events", b)
	}
}

// countedLate: counts that come late give what they would have given in time.
func (k *perTokenCheck) countedLate() {
	k.t.Helper()
	for _, early := range []Usage{{}, {CompletionTokens: count(k.u.CompletionTokens.Value/2 + 3), ReasoningTokens: count(1)}} {
		late := Compute(k.c, early, k.streamed, EngineTiming{})
		late.CountLate(k.c, k.u, k.streamed)
		if late != k.m {
			k.fail("counted late after %+v:\n%+v", early, late)
		}
	}
}

// Marking an event runs on the per-event path; computing, once a request.
// Neither allocates.
func TestMarkAndComputeAllocateNothing(t *testing.T) {
	c := &Clock{Arrival: at(0), Accepted: at(10)}
	now := at(20)
	if allocs := testing.AllocsPerRun(100, func() {
		now = now.Add(time.Millisecond)
		c.MarkOutput(now, OutputContent|OutputReasoning)
	}); allocs != 0 {
		t.Fatalf("MarkOutput allocates %v times per call, want 0", allocs)
	}
	c.Done = now
	u := Usage{CompletionTokens: count(3), ReasoningTokens: count(1)}
	var m Metrics
	if allocs := testing.AllocsPerRun(100, func() { m = Compute(c, u, true, EngineTiming{}); m.CountLate(c, u, true) }); allocs != 0 {
		t.Fatalf("Compute allocates %v times per call, want 0", allocs)
	}
	if !m.TokenEvents.Set {
		t.Fatalf("want the figures over the events: %+v", m)
	}
}

// TestPrefillAndCacheClass: the cache class from the counts, and prefill
// speed as the tokens computed over arrival to first token, less the
// engine's own queue time when it reports one.
func TestPrefillAndCacheClass(t *testing.T) {
	// Arrival 0, accepted 10, first token 110: 110 ms from arrival.
	clock := func() *Clock { return streamClock(10, []float64{110, 130}, 140) }
	for _, tc := range []struct {
		name     string
		usage    Usage
		engine   EngineTiming
		streamed bool
		class    CacheClass
		prefill  Number
	}{
		{"no cache report", Usage{PromptTokens: count(1100)}, EngineTiming{}, true, CacheUnknown, Number{}},
		{"nothing cached", Usage{PromptTokens: count(1100), CachedTokens: count(0)}, EngineTiming{}, true, CacheNone, Number{10000, true}},
		{"partly cached", Usage{PromptTokens: count(1100), CachedTokens: count(550)}, EngineTiming{}, true, CachePartial, Number{5000, true}},
		{"as few computed as measured", Usage{PromptTokens: count(1100), CachedTokens: count(1100 - MinPrefillTokens)}, EngineTiming{}, true, CachePartial,
			Number{MinPrefillTokens / 0.110, true}},
		{"fewer computed: the overhead's share is too large", Usage{PromptTokens: count(1100), CachedTokens: count(1101 - MinPrefillTokens)}, EngineTiming{}, true, CachePartial, Number{}},
		{"a full hit is never measured", Usage{PromptTokens: count(1100), CachedTokens: count(1088)}, EngineTiming{}, true, CacheFull, Number{}},
		{"the engine's queue time is not prefill", Usage{PromptTokens: count(1100), CachedTokens: count(0)},
			EngineTiming{Reported: true, QueueTime: Number{55, true}}, true, CacheNone, Number{20000, true}},
		{"an engine queue time longer than the TTFT is not believed", Usage{PromptTokens: count(1100), CachedTokens: count(0)},
			EngineTiming{Reported: true, QueueTime: Number{500, true}}, true, CacheNone, Number{10000, true}},
		{"every token cached: no prefill to measure", Usage{PromptTokens: count(64), CachedTokens: count(64)}, EngineTiming{}, true, CacheFull, Number{}},
		{"a short prompt's few cached tokens are not a full hit", Usage{PromptTokens: count(20), CachedTokens: count(4)}, EngineTiming{}, true, CachePartial, Number{}},
		{"more cached than the prompt", Usage{PromptTokens: count(10), CachedTokens: count(64)}, EngineTiming{}, true, CacheUnknown, Number{}},
		{"not streamed: no first token", Usage{PromptTokens: count(1100), CachedTokens: count(0)}, EngineTiming{}, false, CacheNone, Number{}},
		{"Anthropic's shape counts the whole prompt", Usage{PromptTokens: count(1000), CachedTokens: count(990), CacheWriteTokens: count(10), CacheApart: true},
			EngineTiming{}, true, CachePartial, Number{1010 / 0.110, true}},
	} {
		m := Compute(clock(), tc.usage, tc.streamed, tc.engine)
		if m.Cache != tc.class {
			t.Errorf("%s: class %v, want %v", tc.name, m.Cache, tc.class)
		}
		if got := m.PrefillTokensPerSecond; got.Set != tc.prefill.Set || math.Abs(got.Value-tc.prefill.Value) > 1e-6 {
			t.Errorf("%s: prefill %+v, want %+v", tc.name, got, tc.prefill)
		}
		// Late counts give what the counts in time would have given.
		late := Compute(clock(), Usage{}, tc.streamed, tc.engine)
		late.CountLate(clock(), tc.usage, tc.streamed)
		if p := m.PrefillTime; p.Set != m.PrefillTokensPerSecond.Set || p.Set && math.Abs(float64(m.PromptTokens.Value-m.CachedTokens.Value)/(p.Value/1000)-m.PrefillTokensPerSecond.Value) > 1e-6 {
			t.Errorf("%s: prefill time %+v does not give the speed %+v", tc.name, p, m.PrefillTokensPerSecond)
		}
		if late.Cache != m.Cache || late.PrefillTokensPerSecond != m.PrefillTokensPerSecond || late.PrefillTime != m.PrefillTime ||
			late.EnginePrefillTokensPerSecond != m.EnginePrefillTokensPerSecond {
			t.Errorf("%s: late counts gave %v %+v, in time %v %+v", tc.name, late.Cache, late.PrefillTokensPerSecond, m.Cache, m.PrefillTokensPerSecond)
		}
	}
}

// TestEngineHeadersCompleteTheBody: the body's figures first, the
// headers' where the body has none, and the headers' own total.
func TestEngineHeadersCompleteTheBody(t *testing.T) {
	n := func(v float64) Number { return Number{v, true} }
	body := EngineTiming{Reported: true, Source: "vllm", QueueTime: n(10), TimeToFirstToken: n(20), GenerationTime: n(30), Total: n(60)}
	headers := EngineTiming{Reported: true, Source: "vllm", QueueTime: n(11), MeanITL: n(3), InferenceTime: n(50), Total: n(75)}
	got := body.WithHeaders(headers)
	want := EngineTiming{Reported: true, Source: "vllm", QueueTime: n(10), TimeToFirstToken: n(20), GenerationTime: n(30),
		MeanITL: n(3), InferenceTime: n(50), Total: n(75)}
	if got != want {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	if got := (EngineTiming{}).WithHeaders(headers); got != headers {
		t.Errorf("headers alone: %+v", got)
	}
	if got := body.WithHeaders(EngineTiming{}); got != body {
		t.Errorf("body alone: %+v", got)
	}
	t0 := time.Unix(0, 0)
	m := Compute(&Clock{Arrival: t0, Accepted: t0, Done: t0.Add(80 * time.Millisecond)}, Usage{}, false, got)
	if m.Overhead != n(5) {
		t.Errorf("overhead %+v, want e2e − the headers' total", m.Overhead)
	}
	if js := string(m.AppendJSON(nil)); !bytes.Contains([]byte(js), []byte(`"total_ms":75.000,"inference_time_ms":50.000}`)) {
		t.Errorf("JSON %s", js)
	}
}

// TestTokensPerEvent: an event is not a token. The mean is the engine's
// count over the token events; the largest is known only where every
// token event carried the running count, and ends at the engine's total.
func TestTokensPerEvent(t *testing.T) {
	type event struct {
		at      float64
		token   bool
		running int64 // -1: no count on the event
	}
	for _, tt := range []struct {
		name      string
		events    []event
		usage     Count
		mean      Number
		max       Count
		perTokens Number // mean_itl_ms, per token whatever the events
	}{
		{"three tokens per event, final usage only", []event{{60, true, -1}, {80, true, -1}, {100, true, -1}, {101, false, 9}},
			count(9), Number{3, true}, Count{}, Number{40.0 / 8, true}},
		{"running counts on every event", []event{{50, false, 0}, {60, true, 1}, {80, true, 5}, {100, true, 8}, {101, false, 8}},
			count(8), Number{8.0 / 3, true}, count(4), Number{40.0 / 7, true}},
		{"a token event without its count", []event{{60, true, 2}, {80, true, -1}, {100, true, 9}},
			count(9), Number{3, true}, Count{}, Number{40.0 / 8, true}},
		{"running counts that stop short of the total", []event{{60, true, 2}, {80, true, 4}},
			count(7), Number{3.5, true}, Count{}, Number{20.0 / 6, true}},
		{"running counts short of the total the usage event brings", []event{{60, true, 1}, {80, true, 2}, {81, false, 9}},
			count(9), Number{4.5, true}, Count{}, Number{20.0 / 8, true}},
		{"a count below the events: per event, no tokens per event", []event{{60, true, -1}, {80, true, -1}, {100, true, 1}},
			count(1), Number{}, Count{}, Number{20, true}},
		{"no count", []event{{60, true, -1}, {80, true, -1}}, Count{}, Number{}, Count{}, Number{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := &Clock{Arrival: at(0), Accepted: at(10), Done: at(110)}
			for _, ev := range tt.events {
				if ev.token {
					c.MarkOutput(at(ev.at), OutputContent)
				}
				if ev.running >= 0 {
					c.CountOutput(count(ev.running), ev.token)
				}
			}
			m := Compute(c, Usage{CompletionTokens: tt.usage}, true, EngineTiming{})
			if m.TokensPerEvent != tt.mean || m.MaxTokensPerEvent != tt.max {
				t.Fatalf("tokens per event %+v, largest %+v; want %+v, %+v", m.TokensPerEvent, m.MaxTokensPerEvent, tt.mean, tt.max)
			}
			if d := m.MeanITL.Value - tt.perTokens.Value; m.MeanITL.Set != tt.perTokens.Set || d > 1e-9 || d < -1e-9 {
				t.Fatalf("mean_itl_ms %+v, want %+v", m.MeanITL, tt.perTokens)
			}
			if m.MaxITL.Value < m.MeanITL.Value {
				t.Fatalf("max_itl_ms %v below mean_itl_ms %v", m.MaxITL.Value, m.MeanITL.Value)
			}
		})
	}
}

// TestSentTokens: a usage record's completion count is the engine's usage
// where it came; for a stream without it, the running count when every
// token event carried one, else one per token event; unknown for an answer
// sent whole without usage.
func TestSentTokens(t *testing.T) {
	type event struct {
		token   bool
		running int64 // -1: no count on the event
	}
	for _, tt := range []struct {
		name     string
		events   []event
		usage    Count
		streamed bool
		want     Count
		from     CountSource
	}{
		{"usage came", []event{{true, -1}, {true, -1}}, count(9), true, count(9), CountUsage},
		{"cut: token events", []event{{false, -1}, {true, -1}, {true, -1}, {true, -1}}, Count{}, true, count(3), CountCounted},
		{"cut: running counts", []event{{true, 2}, {true, 5}, {false, 5}}, Count{}, true, count(5), CountCounted},
		{"cut: a token event without its count", []event{{true, 2}, {true, -1}, {true, 6}}, Count{}, true, count(6), CountCounted},
		{"cut: a count that stopped", []event{{true, 1}, {true, -1}, {true, -1}}, Count{}, true, count(3), CountCounted},
		{"cut before any token", []event{{false, -1}}, Count{}, true, count(0), CountCounted},
		{"answer sent whole, no usage", nil, Count{}, false, Count{}, CountUnknown},
		{"answer sent whole", nil, count(4), false, count(4), CountUsage},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := &Clock{Arrival: at(0), Accepted: at(10), Done: at(110)}
			for i, ev := range tt.events {
				if ev.token {
					c.MarkOutput(at(float64(20+i)), OutputContent)
				}
				if ev.running >= 0 {
					c.CountOutput(count(ev.running), ev.token)
				}
			}
			m := Compute(c, Usage{CompletionTokens: tt.usage}, tt.streamed, EngineTiming{})
			if m.Sent != tt.want || m.SentFrom != tt.from {
				t.Fatalf("sent %+v from %v, want %+v from %v", m.Sent, m.SentFrom, tt.want, tt.from)
			}
			if m.CompletionTokens != tt.usage {
				t.Fatalf("completion_tokens %+v: the object's count is the usage's only", m.CompletionTokens)
			}
		})
	}
}

// TestEnginePrefillSpeed: where the engine reports its prefill, the same
// tokens over it are its speed, full hits included (the engine's figure,
// as llama.cpp's prompt_per_second); the sidecar's own needs
// MinPrefillTokens.
func TestEnginePrefillSpeed(t *testing.T) {
	clock := func() *Clock { return streamClock(10, []float64{110, 130}, 140) }
	for _, tc := range []struct {
		name            string
		usage           Usage
		engineMs        float64
		engine, sidecar Number
	}{
		{"a new prompt", Usage{PromptTokens: count(392), CachedTokens: count(0)}, 24.1, Number{392 / 0.0241, true}, Number{392 / 0.110, true}},
		{"38 new tokens after a cached prefix", Usage{PromptTokens: count(463), CachedTokens: count(425)}, 6.6, Number{38 / 0.0066, true}, Number{}},
		{"the same prompt again", Usage{PromptTokens: count(461), CachedTokens: count(460)}, 1.6, Number{1 / 0.0016, true}, Number{}},
		{"no engine figure", Usage{PromptTokens: count(392), CachedTokens: count(0)}, 0, Number{}, Number{392 / 0.110, true}},
	} {
		e := EngineTiming{}
		if tc.engineMs > 0 {
			e = EngineTiming{Reported: true, Source: "llama.cpp", TimeToFirstToken: Number{tc.engineMs, true}}
		}
		m := Compute(clock(), tc.usage, true, e)
		// The engine's speed goes into its member of the object.
		var obj struct {
			Engine *struct {
				Prefill *float64 `json:"prefill_tokens_per_second"`
			} `json:"engine"`
		}
		if err := json.Unmarshal(m.AppendJSON(nil), &obj); err != nil {
			t.Fatal(err)
		}
		if got := obj.Engine != nil && obj.Engine.Prefill != nil; got != tc.engine.Set ||
			got && math.Abs(*obj.Engine.Prefill-tc.engine.Value) > 0.001 {
			t.Errorf("%s: metrics.engine %+v, want the engine's speed %+v", tc.name, obj.Engine, tc.engine)
		}
		for _, f := range []struct {
			name      string
			got, want Number
		}{{"engine", m.EnginePrefillTokensPerSecond, tc.engine}, {"sidecar", m.PrefillTokensPerSecond, tc.sidecar}} {
			if f.got.Set != f.want.Set || math.Abs(f.got.Value-f.want.Value) > 1e-6 {
				t.Errorf("%s: %s speed %+v, want %+v", tc.name, f.name, f.got, f.want)
			}
		}
	}
}
