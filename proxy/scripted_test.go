package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
)

// scriptedEngine is an upstream that answers at the byte level, for the
// faults an HTTP server library will not produce: resets, bodies that
// contradict their headers, oversized events. Each connection's request is
// read and handed, with the raw connection, to the script.
type scriptedEngine struct {
	ln       net.Listener
	requests chan scriptedRequest
	wg       sync.WaitGroup
}

type scriptedRequest struct {
	Header http.Header
	URI    string
	Body   []byte
}

// newScriptedEngine serves every connection with script, which owns the
// connection and closes it when done.
func newScriptedEngine(t *testing.T, script func(c net.Conn, req *http.Request, body []byte)) *scriptedEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &scriptedEngine{ln: ln, requests: make(chan scriptedRequest, 64)}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					c.Close()
					return
				}
				body, _ := io.ReadAll(req.Body)
				select {
				case e.requests <- scriptedRequest{Header: req.Header, URI: req.RequestURI, Body: body}:
				default:
				}
				script(c, req, body)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		e.wg.Wait()
	})
	return e
}

func (e *scriptedEngine) URL() string { return "http://" + e.ln.Addr().String() }

// reset closes c with an RST instead of a FIN.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0) //nolint:errcheck
	}
	c.Close()
}

// chunk frames s as one HTTP/1.1 chunk.
func chunk(s string) string {
	return strconv.FormatInt(int64(len(s)), 16) + "\r\n" + s + "\r\n"
}
