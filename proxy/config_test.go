package proxy

import (
	"strings"
	"testing"
)

func TestValidateReportsEveryProblem(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Listen = "8001"
	cfg.Mode = "sometimes"
	cfg.UpstreamIdleTimeout = -1
	cfg.MaxEventSize = 10
	err := cfg.Validate()
	if err == nil {
		t.Fatal("invalid config accepted")
	}
	for _, want := range []string{"listen address", "per-request metrics mode", "upstream idle timeout", "max event size"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not report the %s", err, want)
		}
	}
	if def := DefaultConfig(); def.Validate() != nil {
		t.Fatalf("the defaults are invalid: %v", def.Validate())
	}
}
