package tlsserve

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Client certificate requirements, as vLLM's --ssl-cert-reqs takes them
// (Python's ssl.CERT_NONE, CERT_OPTIONAL, CERT_REQUIRED).
const (
	ClientCertNone     = 0
	ClientCertOptional = 1
	ClientCertRequired = 2
)

// Config is the TLS configuration the sidecar serves with: Go's defaults
// from TLS 1.2, the certificate from files re-read when they change, and
// client certificates (clientCerts: one of the ClientCert constants)
// checked against a CA file, re-read the same way, when asked. It is nil
// without a certificate and key: the sidecar serves plain HTTP.
func Config(files Files, clientCerts int, log *slog.Logger) (*tls.Config, error) {
	if files.Cert == "" && files.Key == "" {
		return nil, nil
	}
	r, err := newCertReloader(files, clientAuth(clientCerts), log)
	if err != nil {
		return nil, err
	}
	return r.serverConfig(), nil
}

// clientAuth is what crypto/tls asks of clients for --ssl-cert-reqs.
func clientAuth(reqs int) tls.ClientAuthType {
	switch reqs {
	case ClientCertOptional:
		return tls.VerifyClientCertIfGiven
	case ClientCertRequired:
		return tls.RequireAndVerifyClientCert
	}
	return tls.NoClientCert
}

// Files are the files the sidecar serves TLS from.
type Files struct {
	Cert, Key string
	ClientCA  string // "" when client certificates are not checked
}

// certReloader serves TLS from files and re-reads them when they change,
// as a Kubernetes Secret's rotation changes the mounted files: new
// connections get the new certificate, and have their client certificates
// checked against the new CA, without a restart; open ones (streams) keep
// what they began with. A file that does not load (half rotated, or
// broken) leaves the last good one in use, logged: the certificate pair
// and the client CA are each kept or replaced on their own.
//
// A handshake never waits on the files. It takes the configuration last
// loaded, and at most once per every it starts a check on a goroutine of
// its own, one at a time, which reads and parses the files and swaps in
// what loads. A filesystem that hangs (a volume being updated) holds that
// goroutine, never a handshake.
type certReloader struct {
	files Files
	base  *tls.Config // what every configuration served shares
	log   *slog.Logger

	// served is base with the certificate and the client CAs last loaded.
	served atomic.Pointer[tls.Config]
	// pairStamp and caStamp are of the files served was loaded from:
	// only a check touches them, one at a time.
	pairStamp [2]fileStamp
	caStamp   fileStamp

	mu sync.Mutex // never held across a file access
	// every is how often, at most, a handshake starts a check.
	every time.Duration
	// checked is when the latest check started; running, closed when the
	// check in progress ends, is nil when none runs.
	checked time.Time
	running chan struct{}
}

// certCheckEvery is how often, at most, the files are looked at: once a
// second at a handshake, a stat of each.
const certCheckEvery = time.Second

// fileStamp tells a file's change: a rotation writes new files.
type fileStamp struct {
	mod  time.Time
	size int64
}

func stampOf(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{mod: fi.ModTime(), size: fi.Size()}, nil
}

// newCertReloader loads the files, failing on any that does not load.
func newCertReloader(files Files, auth tls.ClientAuthType, log *slog.Logger) (*certReloader, error) {
	if files.Cert == "" || files.Key == "" {
		return nil, errors.New("TLS needs both a certificate file and a key file")
	}
	r := &certReloader{files: files, log: log, every: certCheckEvery,
		base: &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}, ClientAuth: auth}}
	stamp, err := r.stampPair()
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(files.Cert, files.Key)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate: %w", err)
	}
	var pool *x509.CertPool
	if files.ClientCA != "" {
		if r.caStamp, err = stampOf(files.ClientCA); err != nil {
			return nil, fmt.Errorf("client CA file: %w", err)
		}
		if pool, err = loadCertPool(files.ClientCA); err != nil {
			return nil, err
		}
	}
	r.pairStamp = stamp
	r.served.Store(r.with(&cert, pool))
	r.checked = time.Now()
	return r, nil
}

// serverConfig is the configuration to serve with: each handshake gets
// the one last loaded.
func (r *certReloader) serverConfig() *tls.Config {
	c := r.base.Clone()
	c.GetConfigForClient = r.configFor
	return c
}

// with is base serving cert, with pool as the client CAs.
func (r *certReloader) with(cert *tls.Certificate, pool *x509.CertPool) *tls.Config {
	c := r.base.Clone()
	c.Certificates = []tls.Certificate{*cert}
	c.ClientCAs = pool
	return c
}

// configFor is the server's GetConfigForClient: what was last loaded,
// with a check started if one is due. It touches no file.
func (r *certReloader) configFor(*tls.ClientHelloInfo) (*tls.Config, error) {
	r.mu.Lock()
	if r.running == nil && time.Since(r.checked) >= r.every {
		r.startCheckLocked()
	}
	r.mu.Unlock()
	return r.served.Load(), nil
}

// check starts a check unless one runs, and returns a channel closed
// when the check in progress ends.
func (r *certReloader) check() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running == nil {
		r.startCheckLocked()
	}
	return r.running
}

func (r *certReloader) startCheckLocked() {
	done := make(chan struct{})
	r.running, r.checked = done, time.Now()
	go func() {
		defer func() {
			r.mu.Lock()
			r.running = nil
			r.mu.Unlock()
			close(done)
		}()
		r.reload()
	}()
}

// reload reads the files that changed since they were loaded and swaps
// in what loads; a file that does not load keeps what it replaced.
func (r *certReloader) reload() {
	served := r.served.Load()
	cert, pool := &served.Certificates[0], served.ClientCAs
	changed := false
	if stamp, err := r.stampPair(); err == nil && stamp != r.pairStamp {
		if c, err := tls.LoadX509KeyPair(r.files.Cert, r.files.Key); err == nil {
			cert, r.pairStamp, changed = &c, stamp, true
			r.logInfo("TLS certificate reloaded", "cert_file", r.files.Cert)
		} else {
			r.logWarn("TLS certificate changed but does not load; serving the previous one", "err", err)
		}
	}
	if r.files.ClientCA != "" {
		if stamp, err := stampOf(r.files.ClientCA); err == nil && stamp != r.caStamp {
			if p, err := loadCertPool(r.files.ClientCA); err == nil {
				pool, r.caStamp, changed = p, stamp, true
				r.logInfo("client CA reloaded", "ca_file", r.files.ClientCA)
			} else {
				r.logWarn("client CA file changed but does not load; checking client certificates against the previous one", "err", err)
			}
		}
	}
	if changed {
		r.served.Store(r.with(cert, pool))
	}
}

func (r *certReloader) stampPair() ([2]fileStamp, error) {
	c, err := stampOf(r.files.Cert)
	if err != nil {
		return [2]fileStamp{}, fmt.Errorf("TLS certificate: %w", err)
	}
	k, err := stampOf(r.files.Key)
	if err != nil {
		return [2]fileStamp{}, fmt.Errorf("TLS key: %w", err)
	}
	return [2]fileStamp{c, k}, nil
}

// loadCertPool reads a PEM file of CA certificates.
func loadCertPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("client CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("client CA file %s: no PEM certificate in it", path)
	}
	return pool, nil
}

func (r *certReloader) logInfo(msg string, args ...any) {
	if r.log != nil {
		r.log.Info(msg, args...)
	}
}

func (r *certReloader) logWarn(msg string, args ...any) {
	if r.log != nil {
		r.log.Warn(msg, args...)
	}
}
