package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// Client certificate requirements, as vLLM's --ssl-cert-reqs takes them
// (Python's ssl.CERT_NONE, CERT_OPTIONAL, CERT_REQUIRED).
const (
	ClientCertNone     = 0
	ClientCertOptional = 1
	ClientCertRequired = 2
)

// serverTLS is the TLS configuration the sidecar serves with: Go's
// defaults from TLS 1.2, the certificate from files re-read when they
// change, and client certificates checked against a CA file when asked.
func serverTLS(cfg *Config, log *slog.Logger) (*tls.Config, error) {
	if cfg.TLSCertFile == "" && cfg.TLSKeyFile == "" {
		return nil, nil
	}
	certs, err := newCertReloader(cfg.TLSCertFile, cfg.TLSKeyFile, log)
	if err != nil {
		return nil, err
	}
	t := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.get, NextProtos: []string{"http/1.1"}}
	if cfg.TLSClientCAFile != "" {
		pem, err := os.ReadFile(cfg.TLSClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("client CA file: %w", err)
		}
		t.ClientCAs = x509.NewCertPool()
		if !t.ClientCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("client CA file %s: no PEM certificate in it", cfg.TLSClientCAFile)
		}
	}
	switch cfg.TLSClientCerts {
	case ClientCertOptional:
		t.ClientAuth = tls.VerifyClientCertIfGiven
	case ClientCertRequired:
		t.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return t, nil
}

// certReloader serves a certificate and key from files and re-reads them
// when they change, as a Kubernetes Secret's rotation changes the mounted
// files: new connections get the new certificate without a restart, and
// open ones (streams) keep theirs. A pair that does not load (half
// rotated, or broken) leaves the last good one in use, logged.
type certReloader struct {
	certFile, keyFile string
	log               *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   fileStamp // of the files the certificate was read from
	checked time.Time // when the files were last looked at
}

// certCheckEvery is how often, at most, the files are looked at: once a
// second at a handshake, a stat of each.
const certCheckEvery = time.Second

type fileStamp struct {
	certMod, keyMod   time.Time
	certSize, keySize int64
}

func newCertReloader(certFile, keyFile string, log *slog.Logger) (*certReloader, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("TLS needs both a certificate file and a key file")
	}
	r := &certReloader{certFile: certFile, keyFile: keyFile, log: log}
	stamp, err := r.stampNow()
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate: %w", err)
	}
	r.cert, r.stamp, r.checked = &cert, stamp, time.Now()
	return r, nil
}

func (r *certReloader) stampNow() (fileStamp, error) {
	c, err := os.Stat(r.certFile)
	if err != nil {
		return fileStamp{}, fmt.Errorf("TLS certificate: %w", err)
	}
	k, err := os.Stat(r.keyFile)
	if err != nil {
		return fileStamp{}, fmt.Errorf("TLS key: %w", err)
	}
	return fileStamp{certMod: c.ModTime(), keyMod: k.ModTime(), certSize: c.Size(), keySize: k.Size()}, nil
}

// get is the server's GetCertificate.
func (r *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := time.Now(); now.Sub(r.checked) >= certCheckEvery {
		r.checked = now
		if stamp, err := r.stampNow(); err == nil && stamp != r.stamp {
			if cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile); err == nil {
				r.cert, r.stamp = &cert, stamp
				if r.log != nil {
					r.log.Info("TLS certificate reloaded", "cert_file", r.certFile)
				}
			} else if r.log != nil {
				r.log.Warn("TLS certificate changed but does not load; serving the previous one", "err", err)
			}
		}
	}
	return r.cert, nil
}
