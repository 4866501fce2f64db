package proxy

import (
	"strings"
	"testing"

	"github.com/timing-sidecar/timing-sidecar/rewrite"
)

// TestFinishHold runs the hold's transitions: events in, what is written
// and what is held out. Each event is written as the relay would write
// it: "H" or "H+m" for the held event released ahead of it (with the
// metrics), then the event's own fate: its name, "name+m" spliced,
// "-name" removed, "(name)" held. "end" is the end of the stream (or the
// hold's bound).
func TestFinishHold(t *testing.T) {
	facts := map[string]eventFacts{
		"role":   {carriesChoices: true},
		"token":  {kind: rewrite.EventToken, carriesChoices: true},
		"finish": {kind: rewrite.EventToken, carriesChoices: true, ends: true},
		"other":  {carriesChoices: true, ends: true}, // a second choice finishing, empty delta
		"fin+u":  {kind: rewrite.EventToken, carriesChoices: true, ends: true, usageOnChoices: true},
		"usage":  {kind: rewrite.EventUsage},
		"ping":   {keepAlive: true},
		"error":  {kind: rewrite.EventError},
		"done":   {kind: rewrite.EventDone},
	}
	askedUsage := plan{wantMetrics: true}
	noUsage := plan{wantMetrics: true, metricsOnFinish: true}
	hidden := plan{hideUsage: true}
	for _, tt := range []struct {
		name   string
		plan   plan
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
		{"nothing planned: all passes", plan{}, "token fin+u usage done", "token fin+u usage done"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := finishHold{plan: tt.plan}
			var out []string
			for _, name := range strings.Fields(tt.events) {
				if name == "end" {
					if h.held {
						out = append(out, released(&h, h.release()))
					}
					continue
				}
				e := facts[name]
				if !h.waitsForUsage() {
					e.keepAlive = false // read only while a finish waits for the usage
				}
				if release, withMetrics := h.releaseBefore(e); release {
					out = append(out, released(&h, withMetrics))
				}
				switch h.act(e) {
				case actPass:
					out = append(out, name)
				case actSplice:
					h.carried()
					out = append(out, name+"+m")
				case actDrop:
					out = append(out, "-"+name)
				case actHold:
					out = append(out, "("+name+")")
				}
			}
			if got := strings.Join(out, " "); got != tt.want {
				t.Errorf("%s\ngot  %s\nwant %s", tt.events, got, tt.want)
			}
		})
	}
}

func released(h *finishHold, withMetrics bool) string {
	if withMetrics {
		h.carried()
		return "H+m"
	}
	return "H"
}
