package e2e

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
)

// prefillerHeader is the header llm-d's endpoint picker sets on a request
// it splits: the prefill engine's host:port.
const prefillerHeader = "x-prefiller-host-port"

// startRouter runs a routing proxy that behaves as llm-d's decode-pod
// routing sidecar (pd-sidecar, NIXL v2 connector) does, in front of the
// decode engine at decode: a request carrying x-prefiller-host-port goes
// first to that host as the prefill leg (stream off, stream_options
// removed, one token, kv_transfer_params with do_remote_decode), then to
// the decode engine as the decode leg, the client's body with the
// kv_transfer_params the prefill engine returned. Headers, trace context
// included, are copied to both legs; its own response headers go out
// once the decode engine answers. Others pass to the decode engine.
func startRouter(t *testing.T, decode string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if prefiller := r.Header.Get(prefillerHeader); prefiller != "" {
			kv, err := prefillLeg(r, body, "http://"+prefiller)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			body, _ = sjson.SetRawBytes(body, "kv_transfer_params", []byte(kv))
		}
		relay(w, r, decode, body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// prefillLeg sends the prefill leg and returns the kv_transfer_params its
// engine answered with.
func prefillLeg(r *http.Request, body []byte, prefiller string) (string, error) {
	leg, _ := sjson.SetBytes(body, "stream", false)
	leg, _ = sjson.DeleteBytes(leg, "stream_options")
	leg, _ = sjson.SetBytes(leg, "max_tokens", 1)
	leg, _ = sjson.SetRawBytes(leg, "kv_transfer_params", []byte(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`))
	req, _ := http.NewRequestWithContext(r.Context(), http.MethodPost, prefiller+r.URL.Path, bytes.NewReader(leg))
	req.Header = r.Header.Clone()
	req.Header.Del("Content-Length")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	return gjson.GetBytes(answer, "kv_transfer_params").Raw, nil
}

// relay sends body to the engine at base and streams its answer back,
// each read flushed.
func relay(w http.ResponseWriter, r *http.Request, base string, body []byte) {
	req, _ := http.NewRequestWithContext(r.Context(), r.Method, base+r.URL.Path, bytes.NewReader(body))
	req.Header = r.Header.Clone()
	req.Header.Del("Content-Length")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			w.Write(buf[:n])
			w.(http.Flusher).Flush()
		}
		if err != nil {
			return
		}
	}
}
