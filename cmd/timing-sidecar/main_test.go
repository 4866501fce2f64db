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
