package rewrite

import (
	"strings"
	"testing"
)

// TestFinishHold runs the hold's transitions: events in, what is written
// and what is held out. Each event is written as the relay would write
// it: "H" or "H+m" for the held event released ahead of it (with the
// metrics), then the event's own fate: its name, "name+m" spliced,
// "-name" removed, "(name)" held. "end" is the end of the stream (or the
// hold's bound).
func TestFinishHold(t *testing.T) {
	facts := map[string]HoldFacts{
		"role":   {CarriesChoices: true},
		"token":  {Kind: EventToken, CarriesChoices: true},
		"finish": {Kind: EventToken, CarriesChoices: true, Ends: true},
		"other":  {CarriesChoices: true, Ends: true}, // a second choice finishing, empty delta
		"fin+u":  {Kind: EventToken, CarriesChoices: true, Ends: true, UsageOnChoices: true},
		"usage":  {Kind: EventUsage},
		"ping":   {KeepAlive: true},
		"error":  {Kind: EventError},
		"done":   {Kind: EventDone},
	}
	askedUsage := Plan{WantMetrics: true}
	noUsage := Plan{WantMetrics: true, MetricsOnFinish: true}
	hidden := Plan{HideUsage: true}
	for _, tt := range []struct {
		name   string
		plan   Plan
		events string
		want   string
	}{
		{"asked for usage: the usage event takes them", askedUsage, "role token finish usage done", "role token finish usage+m done"},
		{"a second usage event passes as sent", askedUsage, "token usage usage", "token usage+m usage"},
		{"no usage asked: the finish waits for the usage, which goes", noUsage, "token finish usage done", "token (finish) H+m -usage done"},
		{"a ping passes the held finish", noUsage, "token finish ping usage", "token (finish) ping H+m -usage"},
		{"another choice's event: not the last to finish", noUsage, "finish other usage", "(finish) H (other) H+m -usage"},
		{"an error after the finish: metrics so far, then the error", noUsage, "finish error", "(finish) H+m error"},
		{"the stream ends before the usage", noUsage, "token finish end", "token (finish) H+m"},
		{"only the first finishing event waits once metrics went", noUsage, "finish usage finish usage", "(finish) H+m -usage finish -usage"},
		{"usage on the finishing event: held till the next", askedUsage, "token fin+u done", "token (fin+u) H+m done"},
		{"two events with usage: the last takes them", askedUsage, "fin+u fin+u end", "(fin+u) H (fin+u) H+m"},
		{"usage on the finish, then a usage event", askedUsage, "fin+u usage", "(fin+u) H usage+m"},
		{"usage the client never asked for is removed", hidden, "token finish usage done", "token finish -usage done"},
		{"nothing planned: all passes", Plan{}, "token fin+u usage done", "token fin+u usage done"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := FinishHold{Plan: tt.plan}
			var out []string
			for _, name := range strings.Fields(tt.events) {
				if name == "end" {
					if h.held {
						out = append(out, released(&h, h.Release()))
					}
					continue
				}
				e := facts[name]
				if !h.WaitsForUsage() {
					e.KeepAlive = false // read only while a finish waits for the usage
				}
				if release, withMetrics := h.ReleaseBefore(e); release {
					out = append(out, released(&h, withMetrics))
				}
				switch h.Act(e) {
				case ActPass:
					out = append(out, name)
				case ActSplice:
					h.Carried()
					out = append(out, name+"+m")
				case ActDrop:
					out = append(out, "-"+name)
				case ActHold:
					out = append(out, "("+name+")")
				}
			}
			if got := strings.Join(out, " "); got != tt.want {
				t.Errorf("%s\ngot  %s\nwant %s", tt.events, got, tt.want)
			}
		})
	}
}

func released(h *FinishHold, withMetrics bool) string {
	if withMetrics {
		h.Carried()
		return "H+m"
	}
	return "H"
}
