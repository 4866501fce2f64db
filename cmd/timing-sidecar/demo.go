package main

import (
	"time"

	"github.com/urfave/cli/v2"

	"github.com/timing-sidecar/timing-sidecar/e2e/demo"
	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
)

// demoCommand runs the sidecar in front of an emulated engine and prints
// what it measured.
func demoCommand() *cli.Command {
	return &cli.Command{
		Name:  "demo",
		Usage: "run the sidecar in front of a built-in emulated engine and show the metrics it adds (no GPU needed)",
		Flags: []cli.Flag{
			&cli.DurationFlag{Name: "queue", EnvVars: env("demo-queue"), Value: 20 * time.Millisecond, Usage: "How long the emulated engine holds a request before its response headers."},
			&cli.DurationFlag{Name: "ttft", EnvVars: env("demo-ttft"), Value: 80 * time.Millisecond, Usage: "The emulated engine's time from response headers to the first token."},
			&cli.DurationFlag{Name: "itl", EnvVars: env("demo-itl"), Value: 15 * time.Millisecond, Usage: "The emulated engine's gap between token events."},
			&cli.IntFlag{Name: "tokens", EnvVars: env("demo-tokens"), Value: 24, Usage: "Tokens the emulated engine generates per request."},
			&cli.IntFlag{Name: "tokens-per-event", EnvVars: env("demo-tokens-per-event"), Value: 2, Usage: "Tokens per stream event."},
		},
		Action: func(c *cli.Context) error {
			return demo.Run(c.Context, emulator.Timing{
				HeaderDelay:    c.Duration("queue"),
				TTFT:           c.Duration("ttft"),
				ITL:            c.Duration("itl"),
				OutputTokens:   c.Int("tokens"),
				TokensPerEvent: c.Int("tokens-per-event"),
			}, c.App.Writer)
		},
	}
}
