// Command tcprelay is the comparison's floor for a proxy written in Go: it
// relays each client connection to its own engine connection, copying bytes
// through user memory and parsing nothing. What the sidecar costs beyond it
// is the sidecar's own work; what it costs beyond nginx is the Go runtime.
//
//	tcprelay --listen 127.0.0.1:18004 --upstream 127.0.0.1:18000
package main

import (
	"flag"
	"io"
	"log"
	"net"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:18004", "address to accept clients on")
	upstream := flag.String("upstream", "127.0.0.1:18000", "engine address")
	flag.Parse()
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	for {
		c, err := l.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go relay(c, *upstream)
	}
}

func relay(client net.Conn, upstream string) {
	defer client.Close()
	engine, err := net.Dial("tcp", upstream)
	if err != nil {
		return
	}
	defer engine.Close()
	go func() {
		pipe(engine, client)
		engine.Close()
	}()
	pipe(client, engine)
}

// pipe copies through a buffer, as any proxy that looks at the bytes must:
// io.Copy between two TCP connections would splice them in the kernel.
func pipe(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
