// Package demo shows timing-sidecar at work without a GPU: it starts the
// emulated engine and a sidecar in front of it on loopback ports, sends a
// streaming and a non-streaming request that opt in to metrics, and prints
// each request's metrics next to the engine's own record of what it did.
package demo

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tidwall/gjson"

	"github.com/timing-sidecar/timing-sidecar/e2e/bench"
	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
	"github.com/timing-sidecar/timing-sidecar/proxy"
)

// Run runs the demo with the engine paced by timing and writes the report
// to w.
func Run(ctx context.Context, timing emulator.Timing, w io.Writer) error {
	engine := emulator.New(emulator.Config{Timing: timing, Strict: true})
	if err := engine.Start("127.0.0.1:0"); err != nil {
		return err
	}
	defer engine.Close()

	cfg := proxy.DefaultConfig()
	cfg.Upstream = engine.URL()
	base, stop, err := startSidecar(cfg)
	if err != nil {
		return err
	}
	defer stop()

	fmt.Fprintf(w, "timing-sidecar demo\n  emulated engine %s (strict: refuses unknown fields)\n  sidecar         %s -> engine, per-request metrics %s\n",
		engine.URL(), base, cfg.Mode)
	fmt.Fprintf(w, "  engine timing   queue %v, time to first token %v, inter-token gap %v, %d tokens, %d per event\n",
		timing.HeaderDelay, timing.TTFT, timing.ITL, timing.OutputTokens, timing.TokensPerEvent)

	for _, r := range []struct {
		title, body string
		stream      bool
	}{
		{`streaming chat completion ("stream": true, "stream_options": {"include_usage": true})`,
			`{"model":"emulated","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Tell me about foxes"}]}`, true},
		{`non-streaming chat completion`,
			`{"model":"emulated","messages":[{"role":"user","content":"Tell me about foxes"}]}`, false},
	} {
		metrics, id, err := bench.PostForMetrics(ctx, http.DefaultClient, base, r.body, r.stream)
		if err != nil {
			return fmt.Errorf("%s: %w", r.title, err)
		}
		waitCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		rec, err := engine.Wait(waitCtx, id)
		cancel()
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "\n%s\n", r.title)
		report(w, metrics, rec, r.stream)
		fmt.Fprintf(w, "  \"metrics\": %s\n", metrics)
	}
	if err := pooling(ctx, engine.URL(), base, w); err != nil {
		return err
	}
	return besideVLLM(ctx, timing, w)
}

// pooling shows the pooling endpoints measured and passed through: each
// answer byte for byte the engine's, with the sidecar's Server-Timing.
func pooling(ctx context.Context, engine, base string, w io.Writer) error {
	fmt.Fprintf(w, "\nembeddings and rerank (measured and counted by endpoint and model; the answer passes untouched)\n")
	for _, r := range []struct{ path, body string }{
		{"/v1/embeddings", `{"model":"emulated","input":["Tell me about foxes"]}`},
		{"/v1/rerank", `{"model":"emulated","query":"foxes","documents":["Foxes are canids.","Owls hunt at night."]}`},
	} {
		id := "demo" + strings.ReplaceAll(r.path, "/", "-")
		direct, _, err := post(ctx, engine+r.path, r.body, id)
		if err != nil {
			return fmt.Errorf("%s: %w", r.path, err)
		}
		through, timing, err := post(ctx, base+r.path, r.body, id)
		if err != nil {
			return fmt.Errorf("%s: %w", r.path, err)
		}
		fmt.Fprintf(w, "  POST %-16s Server-Timing: %s, answer as the engine's: %v\n", r.path, timing, bytes.Equal(direct, through))
	}
	return nil
}

// post sends a JSON body and returns the answer and its Server-Timing.
func post(ctx context.Context, url, body, id string) ([]byte, string, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
	if err != nil {
		return nil, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return b, resp.Header.Get("Server-Timing"), err
}

// besideVLLM shows the sidecar in front of an engine that reports its own
// metrics, as vLLM does with --enable-per-request-metrics and
// --per-request-spec-decode-metrics summary: the engine's object comes as
// it sent it, member by member, and the sidecar's figures beside it, under
// "timing_sidecar" where the names meet.
func besideVLLM(ctx context.Context, timing emulator.Timing, w io.Writer) error {
	engine := emulator.New(emulator.Config{Timing: timing, PerRequestMetrics: true, SpecDecodeMetrics: "summary"})
	if err := engine.Start("127.0.0.1:0"); err != nil {
		return err
	}
	defer engine.Close()
	cfg := proxy.DefaultConfig()
	cfg.Upstream = engine.URL()
	base, stop, err := startSidecar(cfg)
	if err != nil {
		return err
	}
	defer stop()
	metrics, _, err := bench.PostForMetrics(ctx, http.DefaultClient, base,
		`{"model":"emulated","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Tell me about foxes"}]}`, true)
	if err != nil {
		return fmt.Errorf("beside vLLM's own metrics: %w", err)
	}
	fmt.Fprintf(w, "\nstreaming, beside an engine reporting its own metrics (vLLM: --enable-per-request-metrics,\n"+
		"--per-request-spec-decode-metrics summary): the engine's members where it put them, the sidecar's\n"+
		"beside them, under \"timing_sidecar\" where the names meet:\n")
	fmt.Fprintf(w, "  \"time_to_first_token_ms\": %s (the engine's)\n  \"timing_sidecar\": %s\n  \"speculative_decoding\": %s\n",
		gjson.Get(metrics, "time_to_first_token_ms").Raw, gjson.Get(metrics, "timing_sidecar").Raw, gjson.Get(metrics, "speculative_decoding").Raw)
	return nil
}

// startSidecar serves a sidecar with cfg on a free loopback port and
// returns its base URL and how to stop it.
func startSidecar(cfg proxy.Config) (string, func(), error) {
	sidecar, err := proxy.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	go sidecar.Serve(ln)                                                                          //nolint:errcheck // ends with Shutdown
	return "http://" + ln.Addr().String(), func() { sidecar.Shutdown(context.Background()) }, nil //nolint:errcheck
}

// report prints the sidecar's figures beside the engine's record.
func report(w io.Writer, metrics string, rec emulator.Record, stream bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, "  metric\tsidecar\tengine\thow the engine's figure is taken")
	ms := func(d time.Duration) string { return fmt.Sprintf("%.3f", float64(d)/float64(time.Millisecond)) }
	row := func(field, truth, how string) {
		got := gjson.Get(metrics, field).Raw
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", field, got, truth, how)
	}
	if stream {
		gen := rec.LastToken.Sub(rec.FirstToken)
		row("queue_time_ms", ms(rec.HeadersSent.Sub(rec.Received)), "headers sent − request received")
		row("time_to_first_token_ms", ms(rec.FirstToken.Sub(rec.HeadersSent)), "first token − headers")
		row("generation_time_ms", ms(gen), "last token − first token")
		if rec.CompletionTokens > 1 {
			row("mean_itl_ms", ms(gen/time.Duration(rec.CompletionTokens-1)), "generation / (tokens − 1)")
		}
		row("tokens_per_second", fmt.Sprintf("%.3f", float64(rec.CompletionTokens)/rec.LastToken.Sub(rec.HeadersSent).Seconds()), "tokens / (last token − headers)")
		row("max_itl_ms", ms(rec.MaxTokenGap), "largest gap between token events")
	} else {
		row("tokens_per_second", fmt.Sprintf("%.3f", float64(rec.CompletionTokens)/rec.HeadersSent.Sub(rec.Received).Seconds()), "tokens / (response − request)")
	}
	row("e2e_latency_ms", ms(rec.Done.Sub(rec.Received)), "request received − response done; the sidecar adds its own hop")
	row("prompt_tokens", fmt.Sprint(rec.PromptTokens), "usage reported")
	row("completion_tokens", fmt.Sprint(rec.CompletionTokens), "usage reported")
	tw.Flush()
}
