package proxy

import (
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/timing-sidecar/timing-sidecar/proxy/clientconn"
	"github.com/timing-sidecar/timing-sidecar/proxy/netclock"
	"github.com/timing-sidecar/timing-sidecar/proxy/readahead"
	"github.com/timing-sidecar/timing-sidecar/proxy/upstream"
)

// A stream goes on a loop where both its connections allow it, but not
// once its read-ahead runs (the client's socket was full for the
// headers): the read-ahead's reads and the relay's waits on it are the
// ordinary kind, which would hold the loop's other streams.
func TestAStreamWithItsReadAheadRunningStaysOffTheLoops(t *testing.T) {
	if err := netclock.WaitForKernelStamps(10 * time.Second); err != nil {
		t.Skip(err)
	}
	engine := newFakeEngine(t)
	u, err := upstream.New(upstream.Config{URL: engine.URL(), ConnectTimeout: time.Second, HeaderTimeout: time.Minute,
		KeepAlive: time.Hour, MaxHeaderSize: 4 << 10, KernelStamps: true})
	if err != nil {
		t.Fatal(err)
	}
	x := u.NewExchange(upstream.Body{}, nil, false)
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(engine.URL() + "/v1/chat/completions")
	req.Header.SetMethod("POST")
	req.Header.Set("X-Fake-Tokens", "2")
	req.SetBodyString(`{"model":"m","stream":true,"messages":[]}`)
	resp.StreamBody = true
	if err := x.RoundTrip(req, resp); err != nil {
		t.Fatal(err)
	}
	defer x.Finish(resp, false)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	accepted, err := clientconn.Listener{Listener: ln, KernelStamps: true}.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer accepted.Close()

	cfg := DefaultConfig()
	r := &eventRelay{p: &Proxy{cfg: cfg}, f: &flight{client: accepted.(*clientconn.Conn)}, x: x}
	r.src.reset(r.p, x, x.Body(resp))
	if r.loop() == nil {
		t.Fatal("a plain TCP stream with kernel stamps is not put on a loop")
	}
	r.src.ahead = readahead.Start(x.Body(resp), x.Received, func(any) error { return nil })
	defer r.src.ahead.Stop(x.Abort)
	if r.loop() != nil {
		t.Fatal("a stream whose read-ahead runs is put on a loop")
	}
}
