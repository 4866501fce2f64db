package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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

func (r *readiness) set(err error) {
	r.ready.Store(err == nil)
	if err != nil {
		msg := err.Error()
		r.reason.Store(&msg)
	}
}

// AdminHandler serves /metrics (the sidecar's own series), /healthz (the
// process is up) and /readyz (the engine answers and the sidecar is not
// shutting down).
func (p *Proxy) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(p.registry, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	if p.cfg.AdminPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case p.ready.stopping.Load():
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
		case !p.ready.ready.Load():
			reason := "the engine has not been probed yet"
			if r := p.ready.reason.Load(); r != nil {
				reason = *r
			}
			http.Error(w, "engine not ready: "+reason, http.StatusServiceUnavailable)
		default:
			fmt.Fprintln(w, "ok")
		}
	})
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

// newRegistry is the sidecar's own registry, with the Go runtime and
// process collectors beside its series.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}
