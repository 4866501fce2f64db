package proxy

import (
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestUpstreamCAFileAndServerName: an engine serving HTTPS with a
// certificate of a private CA is reached with --upstream-ca-file, and
// only with it; --upstream-server-name checks the name the certificate
// must carry in place of the URL's host.
func TestUpstreamCAFileAndServerName(t *testing.T) {
	engine := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"list","data":[]}`)
	}))
	defer engine.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: engine.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, caFile, serverName string
		status                   int
	}{
		{"system roots only", "", "", http.StatusBadGateway},
		{"the private CA", ca, "", http.StatusOK},
		{"a name the certificate carries", ca, "example.com", http.StatusOK},
		{"a name it does not", ca, "other.example", http.StatusBadGateway},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := startProxy(t, engine.URL, func(c *Config) { c.UpstreamCAFile, c.UpstreamServerName = tc.caFile, tc.serverName })
			resp, err := http.Get(base + "/v1/models")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
		})
	}
	cfg := DefaultConfig()
	cfg.Upstream, cfg.UpstreamCAFile = engine.URL, filepath.Join(t.TempDir(), "missing.pem")
	if _, err := New(cfg, nil, nil); err == nil || !strings.Contains(err.Error(), "upstream CA file") {
		t.Fatalf("a missing CA file: %v", err)
	}
}
