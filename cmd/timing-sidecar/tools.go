package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/timing-sidecar/timing-sidecar/e2e/bench"
	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
)

// emulateCommand runs the emulated engine on its own, as an engine to try
// the sidecar against and as the benchmark's upstream.
func emulateCommand() *cli.Command {
	return &cli.Command{
		Name:  "emulate",
		Usage: "run the built-in emulated OpenAI-compatible engine (vLLM's wire format, no GPU)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "listen", EnvVars: env("emulate-listen"), Value: "127.0.0.1:8000", Usage: "Address the emulated engine listens on."},
			&cli.DurationFlag{Name: "ttft", EnvVars: env("emulate-ttft"), Value: 50 * time.Millisecond, Usage: "Time from response headers to the first token."},
			&cli.DurationFlag{Name: "itl", EnvVars: env("emulate-itl"), Value: 10 * time.Millisecond, Usage: "Gap between token events."},
			&cli.IntFlag{Name: "tokens", EnvVars: env("emulate-tokens"), Value: 16, Usage: "Tokens per choice when a request sets no max_tokens."},
			&cli.IntFlag{Name: "max-model-len", EnvVars: env("emulate-max-model-len"), Value: emulator.DefaultMaxModelLen,
				Usage: "Context length in tokens: a request whose prompt and max_tokens exceed it gets vLLM's 400."},
		},
		Action: func(c *cli.Context) error {
			e := emulator.New(emulator.Config{Timing: emulator.Timing{TTFT: c.Duration("ttft"), ITL: c.Duration("itl"),
				TokensPerEvent: 1, OutputTokens: c.Int("tokens")}, MaxModelLen: c.Int("max-model-len")})
			ln, err := net.Listen("tcp", c.String("listen"))
			if err != nil {
				return err
			}
			srv := &http.Server{Handler: e.Handler(), ReadHeaderTimeout: 10 * time.Second}
			// The address bound, also when the port was 0 (tests).
			fmt.Fprintf(c.App.ErrWriter, "emulated engine listening on %s\n", ln.Addr())
			go func() { <-c.Context.Done(); srv.Close() }()
			if err := srv.Serve(ln); err != http.ErrServerClosed {
				return err
			}
			return nil
		},
	}
}

// benchCommand is the load tool.
func benchCommand() *cli.Command {
	return &cli.Command{
		Name:      "bench",
		Usage:     "load an OpenAI-compatible URL in front of the emulated engine and report per-event delivery delay and throughput",
		ArgsUsage: "URL",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "concurrency", Aliases: []string{"c"}, EnvVars: env("bench-concurrency"), Value: 64, Usage: "Requests in flight at all times."},
			&cli.DurationFlag{Name: "duration", Aliases: []string{"d"}, EnvVars: env("bench-duration"), Value: 10 * time.Second, Usage: "How long new requests start."},
			&cli.IntFlag{Name: "tokens", EnvVars: env("bench-tokens"), Value: 64, Usage: "Tokens (one per event) per response."},
			&cli.DurationFlag{Name: "itl", EnvVars: env("bench-itl"), Value: 20 * time.Millisecond, Usage: "The engine's gap between events."},
			&cli.BoolFlag{Name: "unary", EnvVars: env("bench-unary"), Usage: "Non-streaming requests: report requests/s and latency."},
			&cli.BoolFlag{Name: "include-metrics", EnvVars: env("bench-include-metrics"), Value: true, Usage: `Send "include_metrics": true.`},
			&cli.BoolFlag{Name: "json", EnvVars: env("bench-json"), Usage: "Print the result as JSON."},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("bench needs the target URL, e.g. http://127.0.0.1:8001")
			}
			r, err := bench.Run(c.Context, bench.Options{
				Target: c.Args().First(), Concurrency: c.Int("concurrency"), Duration: c.Duration("duration"),
				Tokens: c.Int("tokens"), ITL: c.Duration("itl"), Unary: c.Bool("unary"),
				IncludeMetrics: c.Bool("include-metrics"), Progress: c.App.ErrWriter,
			})
			if err != nil {
				return err
			}
			return writeReport(c, r)
		},
	}
}

// accuracyCommand is the accuracy report.
func accuracyCommand() *cli.Command {
	d := bench.DefaultAccuracyOptions
	return &cli.Command{
		Name: "accuracy",
		Usage: "measure on this machine each metric's error against the emulated engine's own record, " +
			"and how soon the engine sees a client leave (engine and sidecar in-process)",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "requests", Aliases: []string{"n"}, EnvVars: env("accuracy-requests"), Value: d.Requests, Usage: "Streams to measure."},
			&cli.IntFlag{Name: "concurrency", Aliases: []string{"c"}, EnvVars: env("accuracy-concurrency"), Value: d.Concurrency, Usage: "Streams in flight at a time."},
			&cli.DurationFlag{Name: "queue", EnvVars: env("accuracy-queue"), Value: d.Timing.HeaderDelay, Usage: "How long the emulated engine holds a request before its response headers."},
			&cli.DurationFlag{Name: "ttft", EnvVars: env("accuracy-ttft"), Value: d.Timing.TTFT, Usage: "The emulated engine's time from response headers to the first token."},
			&cli.DurationFlag{Name: "itl", EnvVars: env("accuracy-itl"), Value: d.Timing.ITL, Usage: "The emulated engine's gap between token events."},
			&cli.IntFlag{Name: "tokens", EnvVars: env("accuracy-tokens"), Value: d.Timing.OutputTokens, Usage: "Tokens (one per event) per stream."},
			&cli.IntFlag{Name: "disconnects", EnvVars: env("accuracy-disconnects"), Value: d.Disconnects,
				Usage: "Clients that leave in each phase (queued, before the first token, mid-stream); 0 skips the disconnect figures."},
			&cli.StringSliceFlag{Name: "conditions", EnvVars: env("accuracy-conditions"),
				Usage: "Run the sidecar as its own process (this binary) under each of these conditions, with each mark clock: idle, busy (two CPU-bound loops beside it), quota (its process held to --cpu-quota of a CPU by a cgroup; needs permission to make one). Empty: engine and sidecar in this process, as before."},
			&cli.Float64Flag{Name: "cpu-quota", EnvVars: env("accuracy-cpu-quota"), Value: 0.1, Usage: "The share of one CPU the quota condition allows the sidecar (0.1: a limits.cpu of 100m)."},
			&cli.BoolFlag{Name: "syscalls", EnvVars: env("accuracy-syscalls"), Usage: "With --conditions, also count the engine-side read system calls per streamed event with strace."},
			&cli.BoolFlag{Name: "json", EnvVars: env("accuracy-json"), Usage: "Print the result as JSON."},
		},
		Action: func(c *cli.Context) error {
			timing := emulator.Timing{HeaderDelay: c.Duration("queue"), TTFT: c.Duration("ttft"), ITL: c.Duration("itl"),
				TokensPerEvent: 1, OutputTokens: c.Int("tokens")}
			if conds := c.StringSlice("conditions"); len(conds) > 0 {
				self, err := os.Executable()
				if err != nil {
					return err
				}
				r, err := bench.Conditions(c.Context, bench.ConditionsOptions{Binary: self, Conditions: conds, Quota: c.Float64("cpu-quota"),
					Requests: c.Int("requests"), Concurrency: c.Int("concurrency"), Timing: timing,
					Syscalls: c.Bool("syscalls"), Progress: c.App.ErrWriter})
				if err != nil {
					return err
				}
				return writeReport(c, r)
			}
			r, err := bench.Accuracy(c.Context, bench.AccuracyOptions{
				Requests: c.Int("requests"), Concurrency: c.Int("concurrency"), Disconnects: c.Int("disconnects"),
				Timing: timing, Progress: c.App.ErrWriter,
			})
			if err != nil {
				return err
			}
			return writeReport(c, r)
		},
	}
}

// report is what the bench and accuracy commands print.
type report interface {
	WriteJSON(io.Writer) error
	WriteTable(io.Writer)
}

// writeReport prints r as a table, or as JSON with --json.
func writeReport(c *cli.Context, r report) error {
	if c.Bool("json") {
		return r.WriteJSON(c.App.Writer)
	}
	r.WriteTable(c.App.Writer)
	return nil
}
