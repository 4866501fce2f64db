package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/timing-sidecar/timing-sidecar/deploy/inject"
)

// injectCommand adds the sidecar to Kubernetes manifests: from kubectl, as
// a Helm post-renderer, or in a kustomize pipeline.
func injectCommand() *cli.Command {
	return &cli.Command{
		Name:      "inject",
		Usage:     "add timing-sidecar to the pods of Kubernetes manifests that run an LLM engine (stdin or files to stdout; a Helm post-renderer)",
		ArgsUsage: "[FILE...]",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "image", EnvVars: env("inject-image"), Usage: "The sidecar's image. Empty: this release's."},
			&cli.StringFlag{Name: "engine-container", EnvVars: env("inject-engine-container"),
				Usage: "Name of the engine's container: the one to take among several candidates, or an engine not known by its command (vllm serve, vLLM's OpenAI entrypoint, SGLang's launch_server, llama-server, text-generation-launcher, KServe's huggingfaceserver), moved through its own --port."},
			&cli.IntFlag{Name: "engine-port", EnvVars: env("inject-engine-port"),
				Usage: "The engine's port where inject cannot read it (a value from a Secret, a default the image changes); for an engine not known by its command, the containerPort that marks its container. Routers and gateways on it are left alone."},
			&cli.StringFlag{Name: "placement", EnvVars: env("inject-placement"), Value: inject.PlacementFront,
				Usage: "Where the sidecar goes in a pod whose engine llm-d's routing sidecar fronts: front (before the routing sidecar, where the client's whole request and TTFT pass; when it serves plain HTTP) or engine (between it and the engine: the decode leg)."},
			&cli.StringSliceFlag{Name: "set", EnvVars: env("inject-set"),
				Usage: "A setting of the sidecar, NAME=VALUE with NAME one of its flags (per-request-metrics=always, slo-ttft=2s, admin-listen=:9200): written as its env var. listen and upstream are the engine's, read from the pod. Repeat for several."},
		},
		Action: func(c *cli.Context) error {
			settings, err := sidecarSettings(c.StringSlice("set"))
			if err != nil {
				return err
			}
			in, err := readInputs(c.Args().Slice(), os.Stdin)
			if err != nil {
				return err
			}
			return inject.Inject(in, c.App.Writer, inject.Options{Image: c.String("image"),
				EngineContainer: c.String("engine-container"), EnginePort: c.Int("engine-port"), Placement: c.String("placement"), Env: settings})
		},
	}
}

// sidecarSettings turns --set NAME=VALUE into the sidecar's env vars, NAME
// being one of its own flags.
func sidecarSettings(sets []string) ([]inject.EnvVar, error) {
	envOf := map[string]string{}
	for _, f := range serveFlags() {
		if ev, ok := f.(interface{ GetEnvVars() []string }); ok && len(ev.GetEnvVars()) > 0 {
			envOf[f.Names()[0]] = ev.GetEnvVars()[0]
		}
	}
	var out []inject.EnvVar
	for _, s := range sets {
		name, value, ok := strings.Cut(s, "=")
		name = strings.TrimPrefix(name, "--")
		v, known := envOf[name]
		if !ok || !known {
			return nil, fmt.Errorf("--set %q: want NAME=VALUE with NAME one of the sidecar's flags (timing-sidecar --help)", s)
		}
		out = append(out, inject.EnvVar{Name: v, Value: value})
	}
	return out, nil
}

// readInputs is the files' contents one after the other, as YAML
// documents, or stdin without files. One file is passed as it is, so that
// JSON comes back JSON. The files are read as inject reads, up to its
// bound, not whole into memory first.
func readInputs(files []string, stdin io.Reader) (io.Reader, error) {
	if len(files) == 0 {
		return stdin, nil
	}
	var parts []io.Reader
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			for _, p := range parts {
				if c, ok := p.(io.Closer); ok {
					c.Close()
				}
			}
			return nil, err
		}
		if len(files) > 1 {
			parts = append(parts, strings.NewReader("\n---\n"))
		}
		parts = append(parts, f)
	}
	return io.MultiReader(parts...), nil
}
