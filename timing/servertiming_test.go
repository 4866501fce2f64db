package timing

import (
	"testing"
	"time"
)

func TestServerTiming(t *testing.T) {
	ms := func(v float64) Number { return Number{Value: v, Set: true} }
	for _, tt := range []struct {
		name string
		m    Metrics
		want string
	}{
		{"every figure, in ms", Metrics{QueueTime: ms(1.5), TimeToFirstToken: ms(40.6404), GenerationTime: ms(82.11), E2ELatency: ms(153.686)},
			"queue;dur=1.500, ttft;dur=40.640, gen;dur=82.110, e2e;dur=153.686"},
		{"what was not measured is left out", Metrics{E2ELatency: ms(12)}, "e2e;dur=12.000"},
		{"nothing measured: empty", Metrics{}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(tt.m.AppendServerTiming([]byte("engine;dur=1, "))); got != "engine;dur=1, "+tt.want {
				t.Errorf("got %q, want the engine's entry then %q", got, tt.want)
			}
		})
	}
}

func TestFirstByteTiming(t *testing.T) {
	arrival := time.Unix(100, 0)
	c := Clock{Arrival: arrival, Accepted: arrival.Add(101899 * time.Microsecond)}
	if got := string(c.AppendFirstByteTiming(nil)); got != "ttfb;dur=101.899" {
		t.Errorf("got %q", got)
	}
	// Out of order, or a mark missing: no entry, never a negative time.
	for _, c := range []Clock{{Arrival: arrival, Accepted: arrival.Add(-time.Millisecond)}, {Accepted: arrival}} {
		if got := c.AppendFirstByteTiming(nil); len(got) != 0 {
			t.Errorf("marks %v: %q, want nothing", c, got)
		}
	}
}
