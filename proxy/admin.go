package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/timing-sidecar/timing-sidecar/telemetry"
	"github.com/timing-sidecar/timing-sidecar/telemetry/requests"
)

// adminIdleTimeout closes admin connections idle for longer than the
// longest usual scrape interval (Prometheus' default is one minute).
const adminIdleTimeout = 2 * time.Minute

// readiness is the engine's state as the background probe last saw it.
type readiness struct {
	ready    atomic.Bool
	stopping atomic.Bool
	reason   atomic.Pointer[string]
}

// state is what /readyz answers: not ready while shutting down, or until
// the engine answers its probe.
func (r *readiness) state() (bool, string) {
	switch {
	case r.stopping.Load():
		return false, "shutting down"
	case !r.ready.Load():
		reason := "the engine has not been probed yet"
		if msg := r.reason.Load(); msg != nil {
			reason = *msg
		}
		return false, "engine not ready: " + reason
	}
	return true, ""
}

func (r *readiness) set(err error) {
	r.ready.Store(err == nil)
	if err != nil {
		msg := err.Error()
		r.reason.Store(&msg)
	}
}

// AdminHandler serves the admin endpoints (telemetry.AdminHandler):
// /metrics, /healthz, and /readyz as the engine probe and shutdown say.
func (p *Proxy) AdminHandler() http.Handler {
	h := telemetry.AdminHandler(p.registry, p.ready.state, p.cfg.AdminPprof)
	if p.debug == nil {
		return h
	}
	mux := http.NewServeMux()
	mux.Handle("/", h)
	mux.Handle("GET /debug/requests", p.debug.Handler(requests.Access(p.cfg.DebugRequests), p.cfg.TraceURL, requests.Render))
	return mux
}

// ServeAdmin serves the admin endpoints on ln and probes the engine in the
// background until Shutdown.
func (p *Proxy) ServeAdmin(ln net.Listener) error {
	p.probeOnce.Do(func() { go p.probeLoop() })
	err := p.admin.Serve(ln)
	if err == http.ErrServerClosed {
		return nil
	}
	return err
}

func (p *Proxy) probeLoop() {
	t := time.NewTicker(p.cfg.ReadinessInterval)
	defer t.Stop()
	for {
		err := p.probe()
		p.ready.set(err)
		p.telemetry.EngineReady(err == nil)
		select {
		case <-t.C:
		case <-p.stop:
			return
		}
	}
}

// probe checks the engine once, within one probe interval.
func (p *Proxy) probe() error {
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.ReadinessInterval)
	defer cancel()
	if p.cfg.ReadinessProbe == ProbeTCP {
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", p.up.Host())
		if err != nil {
			return err
		}
		return conn.Close()
	}
	req, err := http.NewRequestWithContext(ctx, "GET", p.up.BaseURL()+p.cfg.ReadinessPath, nil)
	if err != nil {
		return err
	}
	// /readyz shows the reason to anyone who asks: it names the path
	// without its query, which may hold a token.
	path, _, _ := strings.Cut(p.cfg.ReadinessPath, "?")
	resp, err := p.prober.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("GET %s: %w", path, err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("GET %s answered %d", path, resp.StatusCode)
	}
	return nil
}
