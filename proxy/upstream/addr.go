package upstream

import (
	"fmt"
	"net"
	"net/url"
)

// Addr is where the engine is: a parsed --upstream.
type Addr struct {
	Host string // host:port to dial
	TLS  bool   // https
}

// ParseURL reads the engine's URL: http or https, a host, and a port
// (the scheme's by default); nothing else, as the sidecar forwards each
// request's own path.
func ParseURL(raw string) (Addr, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Addr{}, fmt.Errorf("upstream URL %q: %w", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return Addr{}, fmt.Errorf("upstream URL %q: scheme must be http or https", raw)
	}
	if u.Host == "" || u.Hostname() == "" {
		return Addr{}, fmt.Errorf("upstream URL %q: no host", raw)
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return Addr{}, fmt.Errorf("upstream URL %q: give only scheme, host and port; request paths are forwarded as they come", raw)
	}
	host := u.Host
	if u.Port() == "" {
		port := "80"
		if u.Scheme == "https" {
			port = "443"
		}
		host = net.JoinHostPort(u.Hostname(), port)
	}
	return Addr{Host: host, TLS: u.Scheme == "https"}, nil
}
