package inject

import (
	_ "embed"
	"strconv"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// Name is the sidecar container's name: a pod that has a container of
// that name already has the sidecar.
const Name = "timing-sidecar"

// AdminPort is the sidecar's admin port (/metrics, /readyz, /healthz).
const AdminPort = 9101

// sidecarTemplate is the sidecar's container, the one source of its spec:
// inject sets its first port (the engine's old port, with its name),
// TIMING_SIDECAR_LISTEN and TIMING_SIDECAR_UPSTREAM, and the settings it
// is given.
//
//go:embed sidecar.yaml
var sidecarTemplate string

// EnvVar is one of the sidecar's settings, as its environment variable.
type EnvVar struct{ Name, Value string }

// sidecarContainer is the sidecar's container, listening on the engine's
// old port (named portName) and relaying to the engine on enginePort.
// native keeps restartPolicy Always: an init container that runs beside
// the others.
func sidecarContainer(opts *Options, port int, portName string, enginePort int, native bool) (*yaml.RNode, error) {
	c, err := yaml.Parse(sidecarTemplate)
	if err != nil {
		return nil, err
	}
	if opts.Image != "" {
		if err := c.PipeE(yaml.SetField("image", yaml.NewStringRNode(opts.Image))); err != nil {
			return nil, err
		}
	}
	if !native {
		if err := c.PipeE(yaml.Clear("restartPolicy")); err != nil {
			return nil, err
		}
	}
	first, err := c.Pipe(yaml.Lookup("ports", "[name=http]"))
	if err != nil || first == nil {
		return nil, err
	}
	if err := first.PipeE(yaml.SetField("name", yaml.NewStringRNode(portName))); err != nil {
		return nil, err
	}
	if err := first.PipeE(yaml.SetField("containerPort", intNode(port))); err != nil {
		return nil, err
	}
	settings := append([]EnvVar{
		{"TIMING_SIDECAR_LISTEN", ":" + strconv.Itoa(port)},
		{"TIMING_SIDECAR_UPSTREAM", "http://127.0.0.1:" + strconv.Itoa(enginePort)},
	}, opts.Env...)
	for _, s := range settings {
		if err := setEnv(c, s); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// setEnv sets an env var's value, in its place if the template has it.
func setEnv(c *yaml.RNode, v EnvVar) error {
	env, err := c.Pipe(yaml.Lookup("env"))
	if err != nil {
		return err
	}
	e, err := env.Pipe(yaml.Lookup("[name=" + v.Name + "]"))
	if err != nil {
		return err
	}
	if e == nil {
		// name, then value, the value always a string ("false", "0s").
		return env.PipeE(yaml.Append(&yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{
			yaml.NewScalarRNode("name").YNode(), yaml.NewScalarRNode(v.Name).YNode(),
			yaml.NewScalarRNode("value").YNode(), quoted(v.Value),
		}}))
	}
	if err := e.PipeE(yaml.Clear("valueFrom")); err != nil {
		return err
	}
	return e.PipeE(yaml.SetField("value", yaml.NewRNode(quoted(v.Value))))
}
