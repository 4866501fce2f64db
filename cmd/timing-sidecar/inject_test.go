package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestInjectSetsTheVariant: a canary Deployment's sidecar gets its arm
// from inject --set variant=canary, as the variable the flag reads.
func TestInjectSetsTheVariant(t *testing.T) {
	var out, errOut bytes.Buffer
	args := []string{"timing-sidecar", "inject", "--set", "variant=canary", "--set", "variant-header=X-Variant", "../../deploy/inject/testdata/plain.yaml"}
	if err := newApp(&out, &errOut).RunContext(context.Background(), args); err != nil {
		t.Fatalf("inject: %v\n%s", err, errOut.String())
	}
	env := map[string]string{}
	for _, doc := range strings.Split(out.String(), "\n---\n") {
		var d struct {
			Spec struct {
				Template struct {
					Spec struct {
						// The sidecar is a native sidecar: an init
						// container that keeps running.
						InitContainers []struct {
							Name string `json:"name"`
							Env  []struct{ Name, Value string }
						} `json:"initContainers"`
					} `json:"spec"`
				} `json:"template"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &d); err != nil {
			t.Fatalf("inject's output: %v\n%s", err, doc)
		}
		for _, c := range d.Spec.Template.Spec.InitContainers {
			for _, e := range c.Env {
				env[c.Name+" "+e.Name] = e.Value
			}
		}
	}
	for k, want := range map[string]string{"timing-sidecar TIMING_SIDECAR_VARIANT": "canary", "timing-sidecar TIMING_SIDECAR_VARIANT_HEADER": "X-Variant"} {
		if env[k] != want {
			t.Errorf("%s = %q, want %q; env: %v", k, env[k], want, env)
		}
	}
}
