package main

import (
	"bytes"
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/timing-sidecar/timing-sidecar/proxy"
	"github.com/timing-sidecar/timing-sidecar/rewrite"
)

// parse runs the app's flag parsing and returns the resulting config and
// what proxy.Run would say of it.
func parse(t *testing.T, args ...string) (proxy.Config, error) {
	t.Helper()
	var cfg proxy.Config
	var cfgErr error
	app := newApp(&bytes.Buffer{}, &bytes.Buffer{})
	app.Action = func(c *cli.Context) error {
		cfg = configFrom(c)
		cfgErr = cfg.Validate()
		return nil
	}
	if err := app.RunContext(context.Background(), append([]string{"timing-sidecar"}, args...)); err != nil {
		return cfg, err
	}
	return cfg, cfgErr
}

func TestDefaults(t *testing.T) {
	cfg, err := parse(t)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg, proxy.DefaultConfig()) {
		t.Fatalf("flag defaults\n%+v\ndiffer from proxy.DefaultConfig()\n%+v", cfg, proxy.DefaultConfig())
	}
}

func TestEnvironmentAndFlags(t *testing.T) {
	t.Setenv("TIMING_SIDECAR_UPSTREAM", "http://vllm:8000")
	t.Setenv("TIMING_SIDECAR_PER_REQUEST_METRICS", "always")
	t.Setenv("TIMING_SIDECAR_UPSTREAM_IDLE_TIMEOUT", "90s")
	cfg, err := parse(t, "--per-request-metrics", "off")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Upstream != "http://vllm:8000" || cfg.UpstreamIdleTimeout != 90*time.Second {
		t.Errorf("environment not applied: %+v", cfg)
	}
	if cfg.Mode != rewrite.ModeOff {
		t.Errorf("mode = %s; the flag must win over the environment", cfg.Mode)
	}
}

func TestInvalidSettingsAreRefusedTogether(t *testing.T) {
	_, err := parse(t, "--upstream", "localhost:8000", "--per-request-metrics", "sometimes", "--max-request-body-size", "0")
	if err == nil {
		t.Fatal("invalid settings accepted")
	}
	for _, want := range []string{`upstream URL "localhost:8000"`, `"sometimes"`, "max request body size"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

// TestVariantFlags: the experiment arm's flags and variables reach the
// config, and a bound under 1 is refused.
func TestVariantFlags(t *testing.T) {
	for _, tc := range []struct {
		name          string
		env, args     []string
		variant, hdr  string
		maxVariants   int
		wantErrSubstr string
	}{
		{name: "defaults", maxVariants: proxy.DefaultMaxVariantLabels},
		{name: "flags", args: []string{"--variant", "canary", "--variant-header", "X-Variant", "--max-variant-labels", "3"},
			variant: "canary", hdr: "X-Variant", maxVariants: 3},
		{name: "environment", env: []string{"TIMING_SIDECAR_VARIANT", "canary", "TIMING_SIDECAR_VARIANT_HEADER", "X-Arm"},
			variant: "canary", hdr: "X-Arm", maxVariants: proxy.DefaultMaxVariantLabels},
		{name: "no slot", args: []string{"--variant", "canary", "--max-variant-labels", "0"},
			variant: "canary", maxVariants: 0, wantErrSubstr: "max variant labels 0: must be at least 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := 0; i < len(tc.env); i += 2 {
				t.Setenv(tc.env[i], tc.env[i+1])
			}
			cfg, err := parse(t, tc.args...)
			if tc.wantErrSubstr == "" && err != nil || tc.wantErrSubstr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErrSubstr)) {
				t.Errorf("error %v, want one saying %q", err, tc.wantErrSubstr)
			}
			if cfg.Variant != tc.variant || cfg.VariantHeader != tc.hdr || cfg.MaxVariantLabels != tc.maxVariants {
				t.Errorf("variant %q, header %q, max %d; want %q, %q, %d", cfg.Variant, cfg.VariantHeader, cfg.MaxVariantLabels, tc.variant, tc.hdr, tc.maxVariants)
			}
		})
	}
}
