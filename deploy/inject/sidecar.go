package inject

import (
	"cmp"
	_ "embed"
	"strconv"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// Name is the sidecar container's name: a pod that has a container of
// that name already has the sidecar.
const Name = "timing-sidecar"

// AdminPort is the sidecar's admin port (/metrics, /readyz, /healthz)
// unless the pod holds it already.
const AdminPort = 9101

// adminPortName names the admin port, which the sidecar's probes and the
// ServiceMonitor address.
const adminPortName = "timing-admin"

// sidecarTemplate is the sidecar's container, the one source of its spec:
// inject sets its ports, TIMING_SIDECAR_LISTEN and TIMING_SIDECAR_UPSTREAM,
// and the settings it is given.
//
//go:embed sidecar.yaml
var sidecarTemplate string

// EnvVar is one of the sidecar's settings, as its environment variable.
type EnvVar struct{ Name, Value string }

// sidecarContainer is the sidecar's container as plan places it: on the
// engine's old address, relaying to the engine's new port over loopback.
func sidecarContainer(opts *Options, plan *portPlan, ps *podSpec) (*yaml.RNode, error) {
	c, err := yaml.Parse(sidecarTemplate)
	if err != nil {
		return nil, err
	}
	if opts.Image != "" {
		if err := c.PipeE(yaml.SetField("image", yaml.NewStringRNode(opts.Image))); err != nil {
			return nil, err
		}
	}
	if ps.knative {
		if err := c.PipeE(yaml.Clear("restartPolicy")); err != nil {
			return nil, err
		}
	}
	if err := sidecarPorts(c, plan, ps); err != nil {
		return nil, err
	}
	listen := ":" + strconv.Itoa(plan.listen)
	if plan.addr.scope == loopbackOnly {
		// An engine the pod alone could reach stays so: the sidecar in
		// its place listens on loopback too.
		listen = plan.addr.loopback + listen
	}
	settings := []EnvVar{
		{"TIMING_SIDECAR_LISTEN", listen},
		{"TIMING_SIDECAR_UPSTREAM", "http://" + plan.addr.loopback + ":" + strconv.Itoa(plan.engine)},
	}
	if !plan.adminSet && plan.admin != AdminPort {
		settings = append(settings, EnvVar{"TIMING_SIDECAR_ADMIN_LISTEN", ":" + strconv.Itoa(plan.admin)})
	}
	if plan.leg != "" {
		settings = append(settings, EnvVar{"TIMING_SIDECAR_DISAGGREGATION_LEG", plan.leg})
	}
	for _, s := range append(settings, opts.Env...) {
		if err := setEnv(c, s); err != nil {
			return nil, err
		}
	}
	if ps.knative {
		return c, underKnative(c)
	}
	return c, nil
}

// sidecarPorts declares the sidecar's ports: the engine's old one, under
// the engine's name for it, where the engine declared it or the sidecar
// listens on every interface; and the admin port. Under Knative it
// declares none (the engine's container keeps the one port the pod may
// have: placePorts).
func sidecarPorts(c *yaml.RNode, plan *portPlan, ps *podSpec) error {
	if ps.knative {
		return c.PipeE(yaml.Clear("ports"))
	}
	proxy, err := c.Pipe(yaml.Lookup("ports", "[name=http]"))
	if err != nil || proxy == nil {
		return err
	}
	if !plan.declared && plan.addr.scope == loopbackOnly {
		err = c.PipeE(yaml.Lookup("ports"), yaml.ElementSetter{Keys: []string{"name"}, Values: []string{"http"}})
	} else {
		err = listenPort(proxy, plan)
	}
	if err != nil {
		return err
	}
	admin, err := c.Pipe(yaml.Lookup("ports", "[name="+adminPortName+"]"))
	if err != nil || admin == nil {
		return err
	}
	return setInt(admin, "containerPort", plan.admin)
}

// listenPort makes the template's http port the engine's old one: its
// number, its name where no other port has it (else timing-http, else
// none), and its hostPort and hostIP.
func listenPort(port *yaml.RNode, plan *portPlan) error {
	name := cmp.Or(plan.listenName, "http")
	for _, candidate := range []string{name, "timing-http", ""} {
		name = candidate
		if _, taken := plan.names[name]; !taken || name == plan.listenName {
			break
		}
	}
	var set yaml.Filter = yaml.SetField("name", yaml.NewStringRNode(name))
	if name == "" {
		set = yaml.Clear("name") // both taken: unnamed, found by number
	}
	if err := port.PipeE(set); err != nil {
		return err
	}
	if err := setInt(port, "containerPort", plan.listen); err != nil {
		return err
	}
	if plan.hostPort != "" {
		if err := port.PipeE(yaml.SetField("hostPort", yaml.NewRNode(&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: plan.hostPort}))); err != nil {
			return err
		}
	}
	if plan.hostIP != "" {
		return port.PipeE(yaml.SetField("hostIP", yaml.NewStringRNode(plan.hostIP)))
	}
	return nil
}

// underKnative fits the sidecar to Knative Serving's checks of a
// revision's containers (knative/serving pkg/apis/serving
// k8s_validation.go and fieldmask.go, with the features at their
// defaults): a container without the pod's one port may have no probes,
// and env may not use the downward API (kubernetes.podspec-fieldref).
// Its CPU request is written as the value the template requests; its
// service.instance.id is then a random one per process.
func underKnative(c *yaml.RNode) error {
	for _, probe := range []string{"readinessProbe", "livenessProbe", "startupProbe"} {
		if err := c.PipeE(yaml.Clear(probe)); err != nil {
			return err
		}
	}
	env, err := c.Pipe(yaml.Lookup("env"))
	if err != nil || env == nil {
		return err
	}
	if err := env.PipeE(yaml.ElementSetter{Keys: []string{"name"}, Values: []string{"TIMING_SIDECAR_SERVICE_INSTANCE_ID"}}); err != nil {
		return err
	}
	return setEnv(c, EnvVar{"TIMING_SIDECAR_CPU_REQUEST", scalar(c, "resources", "requests", "cpu")})
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
