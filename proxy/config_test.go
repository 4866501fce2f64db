package proxy

import (
	"strings"
	"testing"
)

func TestParseUpstream(t *testing.T) {
	tests := []struct {
		raw     string
		want    upstreamAddr
		wantErr string
	}{
		{raw: "http://127.0.0.1:8000", want: upstreamAddr{host: "127.0.0.1:8000"}},
		{raw: "http://vllm/", want: upstreamAddr{host: "vllm:80"}},
		{raw: "https://engine.example", want: upstreamAddr{host: "engine.example:443", tls: true}},
		{raw: "http://[::1]:8000", want: upstreamAddr{host: "[::1]:8000"}},
		{raw: "localhost:8000", wantErr: "scheme"},
		{raw: "http://", wantErr: "no host"},
		{raw: "http://vllm:8000/v1", wantErr: "only scheme, host and port"},
		{raw: "http://user:pw@vllm:8000", wantErr: "only scheme, host and port"},
		{raw: "http://vllm:8000?x=1", wantErr: "only scheme, host and port"},
		{raw: "://", wantErr: "missing protocol scheme"},
	}
	for _, tt := range tests {
		t.Run(tt.raw, func(t *testing.T) {
			got, err := parseUpstream(tt.raw)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one about %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("parseUpstream = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

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
