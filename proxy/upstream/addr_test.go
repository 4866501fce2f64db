package upstream

import (
	"strings"
	"testing"
)

func TestParseURL(t *testing.T) {
	tests := []struct {
		raw     string
		want    Addr
		wantErr string
	}{
		{raw: "http://127.0.0.1:8000", want: Addr{Host: "127.0.0.1:8000"}},
		{raw: "http://vllm/", want: Addr{Host: "vllm:80"}},
		{raw: "https://engine.example", want: Addr{Host: "engine.example:443", TLS: true}},
		{raw: "http://[::1]:8000", want: Addr{Host: "[::1]:8000"}},
		{raw: "localhost:8000", wantErr: "scheme"},
		{raw: "http://", wantErr: "no host"},
		{raw: "http://vllm:8000/v1", wantErr: "only scheme, host and port"},
		{raw: "http://user:pw@vllm:8000", wantErr: "only scheme, host and port"},
		{raw: "http://vllm:8000?x=1", wantErr: "only scheme, host and port"},
		{raw: "://", wantErr: "missing protocol scheme"},
	}
	for _, tt := range tests {
		t.Run(tt.raw, func(t *testing.T) {
			got, err := ParseURL(tt.raw)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one about %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseURL = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}
