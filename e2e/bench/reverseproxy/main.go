// Command reverseproxy is Go's standard reverse proxy, as a Go team would
// put one in front of an engine: net/http/httputil.ReverseProxy, flushing
// every write (FlushInterval -1) so streams are not buffered, with enough
// idle connections to the engine to reuse them under load.
//
//	reverseproxy --listen 127.0.0.1:18007 --upstream http://127.0.0.1:18000
package main

import (
	"flag"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:18007", "address to accept clients on")
	upstream := flag.String("upstream", "http://127.0.0.1:18000", "engine base URL")
	flag.Parse()
	u, err := url.Parse(*upstream)
	if err != nil {
		log.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns, t.MaxIdleConnsPerHost = 4096, 4096
	rp.Transport = t
	log.Fatal(http.ListenAndServe(*listen, rp))
}
