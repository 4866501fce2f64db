package clientconn

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// bound is how long a test waits for what loopback does in microseconds.
const bound = 30 * time.Second

// testTLS is a server configuration with a certificate for 127.0.0.1, and
// a client configuration that trusts it.
func testTLS(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}},
		&tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}
}

func await[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(bound):
		t.Fatalf("%s did not happen", what)
		panic("unreachable")
	}
}

// tlsClientThatDoesNotRead is a server Conn, with a 4 KiB send buffer,
// to a TLS client that has sent a request and reads nothing more, with a
// small receive buffer so the server's writes soon wait; raw is the
// client's socket. waits receives when any write to the server's socket
// first waits, from whichever goroutine wrote.
func tlsClientThatDoesNotRead(t *testing.T) (c *Conn, raw net.Conn, waits chan struct{}) {
	t.Helper()
	serverTLS, clientTLS := testTLS(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	waits = make(chan struct{}, 16)
	l := Listener{Listener: ln, TLS: serverTLS, SendBuffer: 4 << 10, Blocked: func() {
		select {
		case waits <- struct{}{}:
		default:
		}
	}}
	t.Cleanup(func() { l.Close() })
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10) }) //nolint:errcheck
	}}
	raw, err = d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	sent := make(chan error, 1)
	go func() { _, err := tls.Client(raw, clientTLS).Write([]byte("GET / HTTP/1.1\r\n\r\n")); sent <- err }()
	nc, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	c = nc.(*Conn)
	t.Cleanup(func() { c.Close() })
	c.SetReadDeadline(time.Now().Add(bound)) //nolint:errcheck
	if _, err := c.Read(make([]byte, 64)); err != nil {
		t.Fatalf("the handshake and the request: %v", err)
	}
	if err := await(t, sent, "the client's request"); err != nil {
		t.Fatal(err)
	}
	return c, raw, waits
}

// fillBelowTLS writes to c's socket, below TLS, until it takes nothing
// for a while: the client's window is shut.
func fillBelowTLS(c *Conn) {
	for stuck := false; !stuck; {
		c.recv.Conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond)) //nolint:errcheck
		n, err := c.recv.Conn.Write(make([]byte, 4<<10))
		stuck = n == 0 && errors.Is(err, os.ErrDeadlineExceeded)
	}
}

// TestStallHookRunsOnlyInsideWrite: under TLS the client's socket is
// written from the watch's goroutine too (crypto/tls sends an alert, or
// answers a client's key update, from within the read that watches for
// the client leaving). When such a write waits on a client that does not
// read, the stall hook does not run while no Write is in progress (the
// relay's state is then the relay's, on its own goroutine); it runs when
// the writer next enters Write, which waits behind that record. The
// count of waits the writer reads meanwhile is not raced (run with -race).
func TestStallHookRunsOnlyInsideWrite(t *testing.T) {
	c, raw, waits := tlsClientThatDoesNotRead(t)

	// This goroutine is the writer; hooks receives, for each run of the
	// hook, whether it was inside a Write.
	var writing atomic.Bool
	write := func(p []byte) error {
		writing.Store(true)
		defer writing.Store(false)
		_, err := c.Write(p)
		return err
	}
	hooks := make(chan bool, 16)
	c.OnStall(func() { hooks <- writing.Load() })
	gone := make(chan struct{})
	c.Watch(func() { close(gone) })

	// The writer fills the socket; its write that waits is ended by its
	// deadline.
	go func() {
		<-waits
		c.SetWriteDeadline(time.Now()) //nolint:errcheck
	}()
	var err error
	for err == nil {
		err = write(make([]byte, 16<<10))
	}
	if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("the write that waited ended with %v, not its deadline", err)
	}
	if inside := await(t, hooks, "the hook for the writer's own wait"); !inside {
		t.Fatal("the hook for the writer's own wait ran outside its Write")
	}
	// The socket may still take a little as the client's delayed
	// acknowledgements come: fill it, below TLS, until it takes nothing
	// for a while (the client's window is shut).
	fillBelowTLS(c)
	c.SetWriteDeadline(time.Time{}) //nolint:errcheck

	// A record too long for TLS: the watch's read answers it with an
	// alert, which waits on the full socket, on the watch's goroutine.
	if _, err := raw.Write([]byte{23, 3, 3, 0xff, 0xff}); err != nil {
		t.Fatal(err)
	}
	await(t, waits, "the alert's wait on the client")
	_ = c.StallEnded() // as the relay reads it between events

	// The writer's next write waits behind the alert: the hook runs then.
	// The client leaves once it has, which ends both writes.
	left := make(chan bool, 1)
	go func() {
		select {
		case inside := <-hooks:
			left <- inside
		case <-time.After(bound):
			close(left)
		}
		raw.Close()
	}()
	if err := write([]byte("x")); err == nil {
		t.Error("a write after the client left succeeded")
	}
	if inside, ok := <-left; !ok {
		t.Error("the hook did not run for a write that waited behind the alert")
	} else if !inside {
		t.Error("the stall hook ran while no Write was in progress, on the watch's goroutine")
	}
	await(t, gone, "the watch seeing the client leave")
	if c.Stalled() <= 0 {
		t.Errorf("the waits on the client were not counted: %v", c.Stalled())
	}
	select {
	case inside := <-hooks:
		t.Errorf("the hook ran once more (inside a Write: %v)", inside)
	default:
	}
}

// blockedWrite is a connection whose writes wait for release.
type blockedWrite struct {
	net.Conn
	entered, release chan struct{}
}

func (b blockedWrite) Write(p []byte) (int, error) {
	b.entered <- struct{}{}
	<-b.release
	return len(p), nil
}

// TestStallHookHoldsTheWriter: when the hook runs on another goroutine
// (a TLS record of crypto/tls's own waits on the client while the writer
// is in Write, behind it), Write does not return before the hook has:
// what the hook sets, the writer sees after its Write, as if the hook had
// run on it (run with -race).
func TestStallHookHoldsTheWriter(t *testing.T) {
	conn := blockedWrite{entered: make(chan struct{}), release: make(chan struct{})}
	c := &Conn{Conn: conn}
	owned := 0 // the writer's state, as a relay's stream is
	hookIn, hookGo := make(chan struct{}), make(chan struct{})
	c.OnStall(func() {
		close(hookIn)
		<-hookGo
		owned = 1
	})
	seen := make(chan int)
	go func() {
		c.Write([]byte("x")) //nolint:errcheck
		seen <- owned
	}()
	await(t, conn.entered, "the write")
	go c.blocked() // a record of TLS's own waits on the client, on another goroutine
	await(t, hookIn, "the hook")
	close(conn.release)
	close(hookGo)
	if got := await(t, seen, "the write's return"); got != 1 {
		t.Errorf("after its Write the writer saw %d: Write returned while the hook ran", got)
	}
}
