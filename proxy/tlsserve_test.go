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
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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
	replaceFile(t, p.certFile, cert)
	replaceFile(t, p.keyFile, key)
}

// replaceFile replaces the file at path with one holding b, at once.
func replaceFile(t *testing.T, path string, b []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
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

// handshakeBound bounds a test's handshake: one that waits on nothing but
// loopback takes milliseconds, even on a saturated CPU.
const handshakeBound = 10 * time.Second

// handshake connects client to a server serving server, over loopback,
// and returns the serial of the certificate served and whether the
// session was resumed; the error is the server's if it refused. The
// client reads a byte the server sends after the handshake, so that it
// takes the server's session ticket (and its verdict on the client's
// certificate, which TLS 1.3 gives after the client's handshake ends).
func handshake(t *testing.T, server, client *tls.Config) (serial int64, resumed bool, err error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(handshakeBound)) //nolint:errcheck // a late handshake fails
		s := tls.Server(c, server)
		if err := s.Handshake(); err != nil {
			served <- err
			return
		}
		_, err = s.Write([]byte{1})
		served <- err
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(handshakeBound)) //nolint:errcheck // a late handshake fails
	client = client.Clone()
	client.ServerName = "localhost"
	c := tls.Client(raw, client)
	err = c.Handshake()
	if err == nil {
		_, err = c.Read(make([]byte, 1))
	}
	raw.Close() // the server waits no more on a client that gave up
	select {
	case serr := <-served:
		if serr != nil {
			err = serr
		}
	case <-time.After(handshakeBound): // it waits on something else
		return 0, false, errors.New("the server's handshake did not end")
	}
	if err != nil {
		return 0, false, err
	}
	st := c.ConnectionState()
	return st.PeerCertificates[0].SerialNumber.Int64(), st.DidResume, nil
}

// awaitCheck waits for a check of the files to end.
func awaitCheck(t *testing.T, done <-chan struct{}) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(handshakeBound):
		t.Fatal("the check of the TLS files did not end")
	}
}

// TestCertReloadNeverWaitsOnDisk: while a read of the certificate file
// hangs (a Secret's volume being updated), handshakes go on with the last
// good certificate, the one that starts the check as well as those
// during it; when the read ends, the new pair is served.
func TestCertReloadNeverWaitsOnDisk(t *testing.T) {
	pki := newTestPKI(t)
	r, err := newCertReloader(tlsFiles{cert: pki.certFile, key: pki.keyFile}, tls.NoClientCert, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.every = 0 // each handshake starts a check, unless one runs
	server, client := r.serverConfig(), &tls.Config{RootCAs: pki.pool}

	// The certificate file becomes a FIFO: a read of it waits until
	// something writes to it, as a read of a hung volume does.
	fifo := filepath.Join(pki.dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(fifo, pki.certFile); err != nil {
		t.Fatal(err)
	}
	released := false
	release := func(b []byte) {
		released = true
		w, err := os.OpenFile(pki.certFile, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(b) //nolint:errcheck // the read sees what came
		w.Close()
	}
	t.Cleanup(func() {
		if !released { // end a read still waiting, if there is one
			if w, err := os.OpenFile(pki.certFile, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				w.Close()
			}
		}
	})

	for i := range 3 {
		if serial, _, err := handshake(t, server, client); err != nil || serial != 2 {
			t.Fatalf("handshake %d while the certificate file hangs: serial %d, %v", i, serial, err)
		}
	}
	certPEM, keyPEM := pki.issue(t, 3, "localhost", x509.ExtKeyUsageServerAuth)
	replaceFile(t, pki.keyFile, keyPEM)
	hung := r.check() // the check the first handshake started, waiting on the FIFO
	release(certPEM)
	awaitCheck(t, hung)
	replaceFile(t, pki.certFile, certPEM) // a plain file again, for later checks
	if serial, _, err := handshake(t, server, client); err != nil || serial != 3 {
		t.Fatalf("once the read ended: serial %d, %v; want the new pair's, 3", serial, err)
	}
}

// TestCertReloadKeepsTheLastGoodPair: a pair that does not load leaves
// the last good one served; the pair is served once it loads.
func TestCertReloadKeepsTheLastGoodPair(t *testing.T) {
	pki := newTestPKI(t)
	r, err := newCertReloader(tlsFiles{cert: pki.certFile, key: pki.keyFile}, tls.NoClientCert, nil)
	if err != nil {
		t.Fatal(err)
	}
	server, client := r.serverConfig(), &tls.Config{RootCAs: pki.pool}
	certPEM, keyPEM := pki.issue(t, 3, "localhost", x509.ExtKeyUsageServerAuth)
	for _, step := range []struct {
		name   string
		write  func()
		serial int64
	}{
		{"a certificate file that is not PEM", func() { replaceFile(t, pki.certFile, []byte("not PEM")) }, 2},
		{"a new certificate with the old key", func() { replaceFile(t, pki.certFile, certPEM) }, 2},
		{"an empty key file", func() { replaceFile(t, pki.keyFile, nil) }, 2},
		{"the new certificate's key", func() { replaceFile(t, pki.keyFile, keyPEM) }, 3},
	} {
		step.write()
		awaitCheck(t, r.check())
		if serial, _, err := handshake(t, server, client); err != nil || serial != step.serial {
			t.Errorf("after %s: serial %d, %v; want %d", step.name, serial, err, step.serial)
		}
	}
}

// TestClientCertsFollowCARotation: a client CA file rotated on disk is what new
// connections' client certificates are checked against, a session the
// old CA's certificate began is not resumed past it, and a CA file that
// does not load leaves the last good one in use.
func TestClientCertsFollowCARotation(t *testing.T) {
	oldCA, newCA := newTestPKI(t), newTestPKI(t)
	r, err := newCertReloader(tlsFiles{cert: oldCA.certFile, key: oldCA.keyFile, clientCA: oldCA.caFile}, tls.RequireAndVerifyClientCert, nil)
	if err != nil {
		t.Fatal(err)
	}
	server := r.serverConfig()
	client := func(cert tls.Certificate, sessions tls.ClientSessionCache) *tls.Config {
		return &tls.Config{RootCAs: oldCA.pool, Certificates: []tls.Certificate{cert}, ClientSessionCache: sessions}
	}
	oldSessions := tls.NewLRUClientSessionCache(4)
	if _, _, err := handshake(t, server, client(oldCA.clientCert, oldSessions)); err != nil {
		t.Fatalf("the old CA's client before the rotation: %v", err)
	}
	if _, resumed, err := handshake(t, server, client(oldCA.clientCert, oldSessions)); err != nil || !resumed {
		t.Fatalf("the old CA's client did not resume its session before the rotation (resumed %v): %v", resumed, err)
	}
	newPEM, err := os.ReadFile(newCA.caFile)
	if err != nil {
		t.Fatal(err)
	}
	replaceFile(t, oldCA.caFile, newPEM)
	awaitCheck(t, r.check())

	for _, step := range []struct {
		name     string
		write    func() // before the step's check; nil for none
		client   *tls.Config
		accepted bool
	}{
		{name: "the new CA's client", client: client(newCA.clientCert, nil), accepted: true},
		{name: "the old CA's client", client: client(oldCA.clientCert, nil)},
		{name: "the old CA's client resuming its session", client: client(oldCA.clientCert, oldSessions)},
		{name: "the new CA's client, the CA file broken", write: func() { replaceFile(t, oldCA.caFile, []byte("not PEM")) },
			client: client(newCA.clientCert, nil), accepted: true},
		{name: "the old CA's client, the CA file broken", client: client(oldCA.clientCert, nil)},
	} {
		if step.write != nil {
			step.write()
			awaitCheck(t, r.check())
		}
		_, _, err := handshake(t, server, step.client)
		if step.accepted && err != nil {
			t.Errorf("%s: refused: %v", step.name, err)
		} else if !step.accepted && err == nil {
			t.Errorf("%s: accepted", step.name)
		}
	}
}
