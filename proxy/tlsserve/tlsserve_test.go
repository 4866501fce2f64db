package tlsserve

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/proxy/tlsserve/testpki"
)

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
	pki := testpki.New(t)
	r, err := newCertReloader(Files{Cert: pki.CertFile, Key: pki.KeyFile}, tls.NoClientCert, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.every = 0 // each handshake starts a check, unless one runs
	server, client := r.serverConfig(), &tls.Config{RootCAs: pki.Pool}

	// The certificate file becomes a FIFO: a read of it waits until
	// something writes to it, as a read of a hung volume does.
	fifo := filepath.Join(pki.Dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(fifo, pki.CertFile); err != nil {
		t.Fatal(err)
	}
	released := false
	release := func(b []byte) {
		released = true
		w, err := os.OpenFile(pki.CertFile, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(b) //nolint:errcheck // the read sees what came
		w.Close()
	}
	t.Cleanup(func() {
		if !released { // end a read still waiting, if there is one
			if w, err := os.OpenFile(pki.CertFile, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				w.Close()
			}
		}
	})

	for i := range 3 {
		if serial, _, err := handshake(t, server, client); err != nil || serial != 2 {
			t.Fatalf("handshake %d while the certificate file hangs: serial %d, %v", i, serial, err)
		}
	}
	certPEM, keyPEM := pki.Issue(t, 3, "localhost", x509.ExtKeyUsageServerAuth)
	testpki.ReplaceFile(t, pki.KeyFile, keyPEM)
	hung := r.check() // the check the first handshake started, waiting on the FIFO
	release(certPEM)
	awaitCheck(t, hung)
	testpki.ReplaceFile(t, pki.CertFile, certPEM) // a plain file again, for later checks
	if serial, _, err := handshake(t, server, client); err != nil || serial != 3 {
		t.Fatalf("once the read ended: serial %d, %v; want the new pair's, 3", serial, err)
	}
}

// TestCertReloadKeepsTheLastGoodPair: a pair that does not load leaves
// the last good one served; the pair is served once it loads.
func TestCertReloadKeepsTheLastGoodPair(t *testing.T) {
	pki := testpki.New(t)
	r, err := newCertReloader(Files{Cert: pki.CertFile, Key: pki.KeyFile}, tls.NoClientCert, nil)
	if err != nil {
		t.Fatal(err)
	}
	server, client := r.serverConfig(), &tls.Config{RootCAs: pki.Pool}
	certPEM, keyPEM := pki.Issue(t, 3, "localhost", x509.ExtKeyUsageServerAuth)
	for _, step := range []struct {
		name   string
		write  func()
		serial int64
	}{
		{"a certificate file that is not PEM", func() { testpki.ReplaceFile(t, pki.CertFile, []byte("not PEM")) }, 2},
		{"a new certificate with the old key", func() { testpki.ReplaceFile(t, pki.CertFile, certPEM) }, 2},
		{"an empty key file", func() { testpki.ReplaceFile(t, pki.KeyFile, nil) }, 2},
		{"the new certificate's key", func() { testpki.ReplaceFile(t, pki.KeyFile, keyPEM) }, 3},
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
	oldCA, newCA := testpki.New(t), testpki.New(t)
	r, err := newCertReloader(Files{Cert: oldCA.CertFile, Key: oldCA.KeyFile, ClientCA: oldCA.CAFile}, tls.RequireAndVerifyClientCert, nil)
	if err != nil {
		t.Fatal(err)
	}
	server := r.serverConfig()
	client := func(cert tls.Certificate, sessions tls.ClientSessionCache) *tls.Config {
		return &tls.Config{RootCAs: oldCA.Pool, Certificates: []tls.Certificate{cert}, ClientSessionCache: sessions}
	}
	oldSessions := tls.NewLRUClientSessionCache(4)
	if _, _, err := handshake(t, server, client(oldCA.ClientCert, oldSessions)); err != nil {
		t.Fatalf("the old CA's client before the rotation: %v", err)
	}
	if _, resumed, err := handshake(t, server, client(oldCA.ClientCert, oldSessions)); err != nil || !resumed {
		t.Fatalf("the old CA's client did not resume its session before the rotation (resumed %v): %v", resumed, err)
	}
	newPEM, err := os.ReadFile(newCA.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	testpki.ReplaceFile(t, oldCA.CAFile, newPEM)
	awaitCheck(t, r.check())

	for _, step := range []struct {
		name     string
		write    func() // before the step's check; nil for none
		client   *tls.Config
		accepted bool
	}{
		{name: "the new CA's client", client: client(newCA.ClientCert, nil), accepted: true},
		{name: "the old CA's client", client: client(oldCA.ClientCert, nil)},
		{name: "the old CA's client resuming its session", client: client(oldCA.ClientCert, oldSessions)},
		{name: "the new CA's client, the CA file broken", write: func() { testpki.ReplaceFile(t, oldCA.CAFile, []byte("not PEM")) },
			client: client(newCA.ClientCert, nil), accepted: true},
		{name: "the old CA's client, the CA file broken", client: client(oldCA.ClientCert, nil)},
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

// TestConfig: no files, plain HTTP; files that do not load, an error at
// start (not at the first handshake); --ssl-cert-reqs as crypto/tls
// reads it.
func TestConfig(t *testing.T) {
	if c, err := Config(Files{}, ClientCertNone, nil); c != nil || err != nil {
		t.Fatalf("no files: %v, %v; want plain HTTP", c, err)
	}
	pki := testpki.New(t)
	if _, err := Config(Files{Cert: pki.CertFile, Key: pki.CAFile}, ClientCertNone, nil); err == nil {
		t.Fatal("a key file that is a certificate loaded")
	}
	if c, err := Config(Files{Cert: pki.CertFile, Key: pki.KeyFile}, ClientCertNone, nil); c == nil || err != nil {
		t.Fatalf("a good pair: %v, %v", c, err)
	}
	for reqs, want := range map[int]tls.ClientAuthType{ClientCertNone: tls.NoClientCert,
		ClientCertOptional: tls.VerifyClientCertIfGiven, ClientCertRequired: tls.RequireAndVerifyClientCert} {
		if got := clientAuth(reqs); got != want {
			t.Errorf("--ssl-cert-reqs %d: %v, want %v", reqs, got, want)
		}
	}
}
