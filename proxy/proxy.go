package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// Proxy is the sidecar's HTTP server and its upstream client.
type Proxy struct {
	cfg    Config
	log    *slog.Logger
	up     *upstream
	server *fasthttp.Server
	pools  *pools
}

// New checks cfg and builds a Proxy.
func New(cfg Config, log *slog.Logger) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	up, err := newUpstream(&cfg)
	if err != nil {
		return nil, err
	}
	p := &Proxy{cfg: cfg, log: log, up: up, pools: newPools(cfg.MaxEventSize)}
	p.server = &fasthttp.Server{
		Handler:      p.handle,
		ErrorHandler: func(ctx *fasthttp.RequestCtx, err error) { requestError(err).write(ctx) },
		// Nothing bounds a response: a generation may stream for minutes.
		WriteTimeout:       0,
		ReadTimeout:        cfg.ClientReadTimeout,
		IdleTimeout:        cfg.ClientIdleTimeout,
		MaxRequestBodySize: cfg.MaxRequestBodySize,
		ReadBufferSize:     cfg.MaxRequestHeaderSize,
		// The engine's Server passes through. fasthttp manages Date itself
		// (it drops a copied one), so the sidecar's clock dates responses.
		NoDefaultServerHeader:         true,
		NoDefaultContentType:          true,
		DisablePreParseMultipartForm:  true,
		DisableHeaderNamesNormalizing: false,
		CloseOnShutdown:               true,
		Logger:                        fasthttpLogger{log},
	}
	return p, nil
}

// Serve answers requests on ln until Shutdown.
func (p *Proxy) Serve(ln net.Listener) error {
	return p.server.Serve(clientListener{ln})
}

// Shutdown stops accepting connections and waits, until ctx is done, for
// requests in flight to finish.
func (p *Proxy) Shutdown(ctx context.Context) error {
	defer p.up.closeIdle()
	return p.server.ShutdownWithContext(ctx)
}

// Run listens on cfg.Listen and serves until ctx is cancelled, then shuts
// down gracefully.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	p, err := New(cfg, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	log.Info("timing-sidecar listening", "listen", ln.Addr().String(), "upstream", cfg.Upstream, "per_request_metrics", string(cfg.Mode))
	served := make(chan error, 1)
	go func() { served <- p.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("timing-sidecar shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Shutdown(shutdownCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("shut down: %w", err)
	}
	return nil
}

// fasthttpLogger sends fasthttp's own messages to slog at debug level:
// they are connection errors the client has already been answered about,
// or clients that left.
type fasthttpLogger struct{ log *slog.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	l.log.Debug(fmt.Sprintf(format, args...), "source", "fasthttp")
}
