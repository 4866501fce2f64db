package proxy

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/timing-sidecar/timing-sidecar/e2e/needs"
)

// testPKI is a CA with a server and a client certificate, in PEM files.
type testPKI struct {
	dir               string
	ca                *x509.Certificate
	caKey             *ecdsa.PrivateKey
	caFile            string
	certFile, keyFile string // the server's
	clientCert        tls.Certificate
	pool              *x509.CertPool
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir()}
	p.caKey, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &p.caKey.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	p.ca, _ = x509.ParseCertificate(der)
	p.caFile = filepath.Join(p.dir, "ca.pem")
	os.WriteFile(p.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	p.pool = x509.NewCertPool()
	p.pool.AddCert(p.ca)
	p.certFile, p.keyFile = filepath.Join(p.dir, "tls.crt"), filepath.Join(p.dir, "tls.key")
	p.issueServer(t, 2)
	cert, key := p.issue(t, 100, "client", x509.ExtKeyUsageClientAuth)
	p.clientCert, err = tls.X509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *testPKI) issue(t *testing.T, serial int64, name string, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{usage}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// issueServer writes a new server certificate of the serial given, as a
// Secret's rotation does: the new files replace the old at once.
func (p *testPKI) issueServer(t *testing.T, serial int64) {
	t.Helper()
	cert, key := p.issue(t, serial, "localhost", x509.ExtKeyUsageServerAuth)
	for path, b := range map[string][]byte{p.certFile: cert, p.keyFile: key} {
		tmp := path + ".new"
		if err := os.WriteFile(tmp, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
}

func startTLSSidecar(t *testing.T, upstream string, configure func(*Config)) string {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Upstream = upstream
	configure(&cfg)
	_, base := serveSidecar(t, cfg, slog.New(slog.DiscardHandler), nil)
	return strings.Replace(base, "http://", "https://", 1)
}

// servedSerial is the serial of the certificate a new connection gets.
func servedSerial(t *testing.T, addr string, pool *x509.CertPool) int64 {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
}

// TestServesHTTPS: with --ssl-certfile and --ssl-keyfile the client port
// speaks HTTPS, to Go's client, curl and the openai SDK alike, streams
// and bodies measured as over plain HTTP; a certificate rotated on disk
// is served to new connections while a stream opened before it goes on.
func TestServesHTTPS(t *testing.T) {
	pki := newTestPKI(t)
	engine := newFakeEngine(t)
	base := startTLSSidecar(t, engine.URL(), func(c *Config) { c.TLSCertFile, c.TLSKeyFile = pki.certFile, pki.keyFile })
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.pool}}}

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
	needs.Program(t, "curl", "curl")
	out, err := exec.Command("curl", "-sS", "--cacert", pki.caFile, "-H", "Content-Type: application/json",
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
	if s := servedSerial(t, addr, pki.pool); s != 2 {
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
	pki.issueServer(t, 3)
	deadline := time.Now().Add(10 * time.Second)
	for servedSerial(t, addr, pki.pool) != 3 {
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
	pki := newTestPKI(t)
	engine := newFakeEngine(t)
	base := startTLSSidecar(t, engine.URL(), func(c *Config) {
		c.TLSCertFile, c.TLSKeyFile, c.TLSClientCAFile, c.TLSClientCerts = pki.certFile, pki.keyFile, pki.caFile, ClientCertRequired
	})
	anonymous := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.pool}}}
	if resp, err := anonymous.Get(base + "/v1/models"); err == nil {
		resp.Body.Close()
		t.Fatalf("a client without a certificate got %d", resp.StatusCode)
	}
	known := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.pool, Certificates: []tls.Certificate{pki.clientCert}}}}
	resp, err := known.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("a client with its certificate got %d", resp.StatusCode)
	}
}
