// Package testpki makes the certificates TLS tests serve and present: a
// CA, a server certificate for localhost, a client certificate, in PEM
// files replaced whole as a Secret's rotation replaces them.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// PKI is a CA with a server and a client certificate, in PEM files.
type PKI struct {
	Dir               string
	CA                *x509.Certificate
	caKey             *ecdsa.PrivateKey
	CAFile            string
	CertFile, KeyFile string // the server's
	ClientCert        tls.Certificate
	Pool              *x509.CertPool // holds the CA
}

// New is a new PKI in a test's temporary directory, its server
// certificate serial 2, its client's 100.
func New(t testing.TB) *PKI {
	t.Helper()
	p := &PKI{Dir: t.TempDir()}
	p.caKey, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &p.caKey.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	p.CA, _ = x509.ParseCertificate(der)
	p.CAFile = filepath.Join(p.Dir, "ca.pem")
	os.WriteFile(p.CAFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	p.Pool = x509.NewCertPool()
	p.Pool.AddCert(p.CA)
	p.CertFile, p.KeyFile = filepath.Join(p.Dir, "tls.crt"), filepath.Join(p.Dir, "tls.key")
	p.IssueServer(t, 2)
	cert, key := p.Issue(t, 100, "client", x509.ExtKeyUsageClientAuth)
	p.ClientCert, err = tls.X509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Issue makes a certificate signed by the CA, for localhost and
// 127.0.0.1, and its key.
func (p *PKI) Issue(t testing.TB, serial int64, name string, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{usage}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.CA, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// IssueServer writes a new server certificate of the serial given, as a
// Secret's rotation does: the new files replace the old at once.
func (p *PKI) IssueServer(t testing.TB, serial int64) {
	t.Helper()
	cert, key := p.Issue(t, serial, "localhost", x509.ExtKeyUsageServerAuth)
	ReplaceFile(t, p.CertFile, cert)
	ReplaceFile(t, p.KeyFile, key)
}

// ReplaceFile replaces the file at path with one holding b, at once.
func ReplaceFile(t testing.TB, path string, b []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// ServedSerial is the serial of the certificate a new connection gets.
func ServedSerial(t testing.TB, addr string, pool *x509.CertPool) int64 {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
}
