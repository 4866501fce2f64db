package main

import (
	"time"

	"github.com/urfave/cli/v2"

	"github.com/timing-sidecar/timing-sidecar/telemetry/compare"
)

// compareCommand compares arms of live traffic from the access log.
func compareCommand() *cli.Command {
	return &cli.Command{
		Name:      "compare",
		Usage:     "compare experiment arms' latencies from access logs, like with like, with intervals and verdicts (files, globs, or - for stdin)",
		ArgsUsage: "LOG...",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "base", EnvVars: env("compare-base"),
				Usage: "The arm the others are compared against. Empty: the first arm read."},
			&cli.BoolFlag{Name: "json", EnvVars: env("compare-json"),
				Usage: "Print the report as JSON (one document per report) instead of text."},
			&cli.StringFlag{Name: "html", EnvVars: env("compare-html"),
				Usage: "Also write the report as one self-contained HTML page to this file, replaced whole at each report. Empty: none."},
			&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, EnvVars: env("compare-follow"),
				Usage: "Read the logs as they grow and report every --every with the anytime-valid test, until interrupted or every input ends (stdin ends; files do not)."},
			&cli.DurationFlag{Name: "every", EnvVars: env("compare-every"), Value: time.Minute,
				Usage: "With --follow, how often to report."},
			&cli.Uint64Flag{Name: "seed", EnvVars: env("compare-seed"), Value: 1,
				Usage: "Seed of the bootstrap: the same logs and seed give the same report."},
		},
		Action: func(c *cli.Context) error {
			return compare.Run(c.Context, compare.Options{
				Inputs: c.Args().Slice(), Base: c.String("base"), JSON: c.Bool("json"), HTML: c.String("html"),
				Follow: c.Bool("follow"), Every: c.Duration("every"), Seed: c.Uint64("seed"),
			}, c.App.Reader, c.App.Writer)
		},
	}
}
