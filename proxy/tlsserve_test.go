package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/proxy/tlsserve"
	"github.com/timing-sidecar/timing-sidecar/proxy/tlsserve/testpki"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/timing-sidecar/timing-sidecar/e2e/needs"
)

func startTLSSidecar(t *testing.T, upstream string, configure func(*Config)) string {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Upstream = upstream
	configure(&cfg)
	_, base := serveSidecar(t, cfg, slog.New(slog.DiscardHandler), nil)
	return strings.Replace(base, "http://", "https://", 1)
}

// TestServesHTTPS: with --ssl-certfile and --ssl-keyfile the client port
// speaks HTTPS, to Go's client, curl and the openai SDK alike, streams
// and bodies measured as over plain HTTP; a certificate rotated on disk
// is served to new connections while a stream opened before it goes on.
func TestServesHTTPS(t *testing.T) {
	pki := testpki.New(t)
	engine := newFakeEngine(t)
	base := startTLSSidecar(t, engine.URL(), func(c *Config) { c.TLSCertFile, c.TLSKeyFile = pki.CertFile, pki.KeyFile })
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.Pool}}}

	// Go's client, a body.
	resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","include_metrics":true,"messages":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"metrics":{`) {
		t.Fatalf("over HTTPS: %d %s", resp.StatusCode, body)
	}
	// curl.
	needs.Program(t, "curl")
	out, err := exec.Command("curl", "-sS", "--cacert", pki.CAFile, "-H", "Content-Type: application/json",
		"-d", `{"model":"m","stream":true,"include_metrics":true,"messages":[]}`, base+"/v1/chat/completions").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "data: [DONE]") || !strings.Contains(string(out), `"metrics":{`) {
		t.Fatalf("curl over HTTPS: %v\n%s", err, out)
	}
	// The openai SDK, a stream.
	sdk := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey("k"), option.WithHTTPClient(client))
	stream := sdk.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{Model: "m",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	events := 0
	for stream.Next() {
		events++
	}
	if err := stream.Err(); err != nil || events == 0 {
		t.Fatalf("the openai SDK over HTTPS: %d events, %v", events, err)
	}

	// A stream open across a rotation.
	addr := strings.TrimPrefix(base, "https://")
	if s := testpki.ServedSerial(t, addr, pki.Pool); s != 2 {
		t.Fatalf("serving serial %d before the rotation", s)
	}
	req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
	req.Header.Set("X-Fake-Tokens", "20")
	req.Header.Set("X-Fake-ITL", "100")
	open, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Body.Close()
	lines := bufio.NewReader(open.Body)
	if _, err := lines.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	pki.IssueServer(t, 3)
	deadline := time.Now().Add(10 * time.Second)
	for testpki.ServedSerial(t, addr, pki.Pool) != 3 {
		if time.Now().After(deadline) {
			t.Fatal("the rotated certificate was not served within 10 s")
		}
		time.Sleep(100 * time.Millisecond) // polling handshakes: the reload has no event to await
	}
	rest, err := io.ReadAll(lines)
	if err != nil || !strings.Contains(string(rest), "data: [DONE]") {
		t.Fatalf("the stream opened before the rotation did not end whole: %v", err)
	}
}

// TestClientCertificates: --ssl-cert-reqs 2 with --ssl-ca-certs refuses a
// client without a certificate from that CA, and serves one with it.
func TestClientCertificates(t *testing.T) {
	pki := testpki.New(t)
	engine := newFakeEngine(t)
	base := startTLSSidecar(t, engine.URL(), func(c *Config) {
		c.TLSCertFile, c.TLSKeyFile, c.TLSClientCAFile, c.TLSClientCerts = pki.CertFile, pki.KeyFile, pki.CAFile, tlsserve.ClientCertRequired
	})
	anonymous := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.Pool}}}
	if resp, err := anonymous.Get(base + "/v1/models"); err == nil {
		resp.Body.Close()
		t.Fatalf("a client without a certificate got %d", resp.StatusCode)
	}
	known := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.Pool, Certificates: []tls.Certificate{pki.ClientCert}}}}
	resp, err := known.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("a client with its certificate got %d", resp.StatusCode)
	}
}
