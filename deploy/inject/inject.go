package inject

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"time"

	"sigs.k8s.io/kustomize/kyaml/kio"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// Options says how to inject.
type Options struct {
	// Image is the sidecar's image; empty keeps the template's.
	Image string
	// EngineContainer and EnginePort name the engine's container, by name
	// or by a containerPort, beside those known by their command.
	EngineContainer string
	EnginePort      int
	// Placement is where the sidecar goes in a pod whose engine an llm-d
	// routing sidecar fronts: PlacementFront (the default) or
	// PlacementEngine.
	Placement string
	// Env is the sidecar's settings, as its environment variables.
	Env []EnvVar
}

// MinGracePeriod is the least terminationGracePeriodSeconds of a pod with
// the sidecar: its template's shutdown grace (100 s) and graceMargin; a
// longer grace set with Env gets its own and the margin.
const MinGracePeriod = 120

// graceMargin is what the pod's grace adds to the sidecar's shutdown grace:
// the drain delay before it, and the engine's own stop after.
const graceMargin = 20

// derived are the settings inject works out from the pod itself: the
// address it takes over and the engine's new one. Env may not set them.
var derived = []string{"TIMING_SIDECAR_LISTEN", "TIMING_SIDECAR_UPSTREAM"}

// ErrNoEngine is the answer to input with no engine in it: a mistake (the
// wrong chart, a values file that renders no engine) more likely than a
// wish to change nothing.
var ErrNoEngine = errors.New("no engine found: no container runs vllm serve, vLLM's OpenAI entrypoint, SGLang's launch_server, llama-server, text-generation-launcher or KServe's huggingfaceserver (name one with --engine-container or --engine-port)")

// ErrOnlyWorkers is the answer to input whose engines are all workers of
// multi-node engines (vllm serve --headless, an SGLang node of rank 1 or
// more): they serve no API, and the pod that does is not in the input.
var ErrOnlyWorkers = errors.New("only multi-node workers found (vllm serve --headless, SGLang with a non-zero --node-rank): they serve no API, so they get no sidecar; inject the manifests of the node that serves the API (rank 0, or the one without --headless)")

// Inject reads Kubernetes YAML documents from in and writes them to out
// with the sidecar in each pod spec that runs an engine. Nothing is
// written unless every document could be handled. A ResourceList in (a
// KRM function's input, as kustomize gives an exec transformer) comes
// back as a ResourceList.
func Inject(in io.Reader, out io.Writer, opts Options) error {
	if err := opts.Validate(); err != nil {
		return err
	}
	src, err := readBounded(in)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	rw := &kio.ByteReadWriter{Reader: bytes.NewReader(src), Writer: &buf, PreserveSeqIndent: true}
	docs, err := rw.Read()
	if err != nil {
		return fmt.Errorf("read the manifests: %w", err)
	}
	for i, doc := range docs {
		// An alias shares its anchor's nodes: an edit through one would
		// change the other unseen. Each gets its own copy, within a bound.
		aliased, err := boundAliases(doc.YNode())
		if err != nil {
			return fmt.Errorf("document %d (%s %q): %w", i+1, doc.GetKind(), doc.GetName(), err)
		}
		if !aliased {
			continue // nothing to expand, and DeAnchor's merge of every mapping is not free
		}
		if err := doc.DeAnchor(); err != nil {
			return fmt.Errorf("document %d: %w", i+1, err)
		}
	}
	maps := configMapsOf(docs)
	count := map[outcome]int{}
	for i, doc := range docs {
		for _, ps := range podSpecsOf(doc) {
			ps.configMaps = maps
			if opts.EngineContainer != "" && hasContainer(ps.node, opts.EngineContainer) {
				count[named]++
			}
			did, err := injectPod(&ps, &opts)
			if err != nil {
				return fmt.Errorf("document %d (%s %q, %s): %w", i+1, doc.GetKind(), doc.GetName(), ps.path, err)
			}
			count[did]++
		}
	}
	if err := verdict(count, docs, &opts); err != nil {
		return err
	}
	if err := rw.Write(docs); err != nil {
		return err
	}
	if isJSON(src) {
		return writeJSON(out, buf.Bytes())
	}
	_, err = out.Write(buf.Bytes())
	return err
}

// outcome is what injectPod did with a pod spec.
type outcome int

const (
	noEngine outcome = iota
	injected
	hadSidecar
	headless // a worker of a multi-node engine, with no API to stand in front of
	named    // counts pods with the container --engine-container names
)

// verdict refuses input where nothing was injected or had the sidecar
// already: the container --engine-container names is in no pod inject
// reads, or no engine is; a kind inject does not read that holds one is
// named, with what to do instead.
func verdict(count map[outcome]int, docs []*yaml.RNode, opts *Options) error {
	if opts.EngineContainer != "" && count[named] == 0 {
		if err := unreadKinds(docs, opts); err != nil {
			return err
		}
		return fmt.Errorf("--engine-container %s: no pod has a container of that name", opts.EngineContainer)
	}
	if count[injected]+count[hadSidecar] > 0 {
		return nil
	}
	if count[headless] > 0 {
		return ErrOnlyWorkers
	}
	if err := unreadKinds(docs, opts); err != nil {
		return err
	}
	return ErrNoEngine
}

// Validate returns every problem with the options at once.
func (o *Options) Validate() error {
	var errs []error
	for _, v := range o.Env {
		if slices.Contains(derived, v.Name) {
			errs = append(errs, fmt.Errorf("%s is set by inject from the pod (the engine's address, and where the engine moves), not by a setting", v.Name))
		}
		if v.Name == "TIMING_SIDECAR_SHUTDOWN_GRACE" {
			if d, err := time.ParseDuration(v.Value); err != nil || d < 0 {
				errs = append(errs, fmt.Errorf("shutdown-grace %q is not a duration", v.Value))
			}
		}
		if v.Name == "TIMING_SIDECAR_USAGE_SPOOL_DIR" {
			if err := spoolDirProblem(v.Value); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if _, err := spoolBound(o); err != nil {
		errs = append(errs, err)
	}
	if _, _, err := adminPort(o); err != nil {
		errs = append(errs, err)
	}
	if o.Placement != "" && o.Placement != PlacementFront && o.Placement != PlacementEngine {
		errs = append(errs, fmt.Errorf("placement %q: want %s or %s", o.Placement, PlacementFront, PlacementEngine))
	}
	if o.EnginePort < 0 || o.EnginePort > 65535 {
		errs = append(errs, fmt.Errorf("--engine-port %d is not a port", o.EnginePort))
	}
	return errors.Join(errs...)
}

// hasContainer tells whether a pod spec has a container named name.
func hasContainer(pod *yaml.RNode, name string) bool {
	for _, c := range podContainers(pod) {
		if scalar(c, "name") == name {
			return true
		}
	}
	return false
}

// injectPod adds the sidecar to a pod spec that runs an engine: what to
// write is decided first, then written.
func injectPod(ps *podSpec, opts *Options) (outcome, error) {
	plan, did, err := planPod(ps, opts)
	if err != nil || plan == nil {
		return did, err
	}
	if err := plan.write(ps, opts); err != nil {
		return noEngine, err
	}
	return injected, nil
}

// podPlan is what inject writes into a pod spec.
type podPlan struct {
	front *found // what the sidecar stands in front of
	ports *portPlan
	// sidecar is its container, spool the pod's new spool volume (nil
	// when the pod has one).
	sidecar, spool *yaml.RNode
}

// planPod decides what a pod spec gets: nothing (with the outcome that
// says why), or a plan. Nothing is written to the pod.
func planPod(ps *podSpec, opts *Options) (*podPlan, outcome, error) {
	if hasContainer(ps.node, Name) {
		return nil, hadSidecar, nil
	}
	f, err := frontOf(ps, opts)
	if err != nil || f == nil {
		return nil, noEngine, err
	}
	if worker, err := servesNoAPI(f, ps); err != nil || worker {
		return nil, headless, err
	}
	if err := f.engine.servesHTTP(f.runs); err != nil {
		return nil, noEngine, err
	}
	if isTrue(scalar(ps.node, "hostNetwork")) {
		return nil, noEngine, errors.New("the engine's pod is on hostNetwork: its ports are the node's, and moving the engine's could collide with another pod's; add the sidecar by hand")
	}
	plan := &podPlan{front: f}
	if plan.ports, err = planPorts(ps, f, opts); err != nil {
		return nil, noEngine, err
	}
	if plan.sidecar, err = sidecarContainer(opts, plan.ports, ps); err != nil {
		return nil, noEngine, err
	}
	if plan.spool, err = planSpool(ps, opts); err != nil {
		return nil, noEngine, err
	}
	return plan, injected, nil
}

// servesNoAPI tells an engine started as a worker of a multi-node engine.
func servesNoAPI(f *found, ps *podSpec) (bool, error) {
	if f.engine.worker == nil {
		return false, nil
	}
	for _, run := range f.runs {
		if worker, err := f.engine.worker(run, ps); err != nil || worker {
			return worker, err
		}
	}
	return false, nil
}

// write carries the plan out: the engine moved (and checked moved), its
// ports and probes, the sidecar, the spool volume, the sysctl for a low
// port, and a grace period long enough.
func (p *podPlan) write(ps *podSpec, opts *Options) error {
	pod, f, plan := ps.node, p.front, p.ports
	list := "initContainers"
	if ps.knative {
		list = "containers"
	}
	target, err := sequenceField(pod, list)
	if err != nil {
		return err
	}
	apply(f.setPort(plan.engineReading, plan.engine))
	if err := verifyMoved(ps, opts, plan.engine); err != nil {
		return err
	}
	if err := placePorts(f.c, cmp.Or(f.engine.movedName, "engine"), plan, ps); err != nil {
		return err
	}
	if err := moveProbes(f.c, plan.listen, plan.listenName, plan.engine); err != nil {
		return err
	}
	if err := target.PipeE(yaml.Append(p.sidecar.YNode())); err != nil {
		return err
	}
	if p.spool != nil {
		if err := addSpool(pod, p.spool); err != nil {
			return err
		}
	}
	if plan.listen < 1024 && !ps.knative {
		if err := unprivilegedPorts(pod, plan.listen); err != nil {
			return err
		}
	}
	if ps.knative {
		// KServe's runtime spec has no grace period of its own: Knative's
		// (or the InferenceService's) applies.
		return nil
	}
	return longEnoughGrace(pod, p.sidecar)
}

// unprivilegedPorts lets the sidecar, which runs as a user without
// capabilities, bind a port below 1024 (TGI's 80): the pod's
// net.ipv4.ip_unprivileged_port_start, a safe sysctl the kubelet allows
// by default (Kubernetes 1.22+), unless the pod sets it already.
func unprivilegedPorts(pod *yaml.RNode, port int) error {
	const name = "net.ipv4.ip_unprivileged_port_start"
	if s, _ := pod.Pipe(yaml.Lookup("securityContext", "sysctls", "[name="+name+"]")); s != nil {
		if n, err := strconv.Atoi(scalar(s, "value")); err != nil || n > port {
			return fmt.Errorf("the pod sets %s to %q, and the sidecar, not root, must bind the engine's port %d: lower it to %d", name, scalar(s, "value"), port, port)
		}
		return nil
	}
	sysctls, err := pod.Pipe(yaml.LookupCreate(yaml.SequenceNode, "securityContext", "sysctls"))
	if err != nil {
		return err
	}
	return sysctls.PipeE(yaml.Append(&yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{
		yaml.NewScalarRNode("name").YNode(), yaml.NewScalarRNode(name).YNode(),
		yaml.NewScalarRNode("value").YNode(), quoted("0"),
	}}))
}

// verifyMoved reads the engine again from what inject wrote, as a check
// that each edit landed where it was meant to: the engine now listens on
// port.
func verifyMoved(ps *podSpec, opts *Options, port int) error {
	f, err := frontOf(ps, opts)
	if err == nil && f != nil {
		var r reading
		r, err = f.readPort()
		if n, _ := strconv.Atoi(r.value); err == nil && r.known && n == port {
			return nil
		}
	}
	return fmt.Errorf("the engine's command, rewritten, does not read as listening on %d (%v): add the sidecar by hand", port, err)
}

// placePorts gives the engine's declared port to the sidecar. Under
// Knative's rules the engine's container keeps declaring it: Knative
// allows one port in the pod and makes the container that declares it
// the one its probes and queue-proxy address, by number, and KServe's
// Standard mode aims its Service at kserve-container's first port; both
// reach the sidecar, which listens on it.
func placePorts(c *yaml.RNode, name string, plan *portPlan, ps *podSpec) error {
	if ps.knative {
		if portsDeclared(ps.node) {
			return nil
		}
		// With two containers Knative wants the port declared; the
		// engine's container declares the one the sidecar now holds.
		return c.PipeE(yaml.SetField("ports", yaml.NewRNode(&yaml.Node{Kind: yaml.SequenceNode, Content: []*yaml.Node{
			{Kind: yaml.MappingNode, Content: []*yaml.Node{yaml.NewScalarRNode("containerPort").YNode(), intNode(plan.listen).YNode()}},
		}})))
	}
	entry, _ := c.Pipe(yaml.Lookup("ports", "[containerPort="+strconv.Itoa(plan.listen)+"]"))
	if entry == nil {
		return nil
	}
	if err := setInt(entry, "containerPort", plan.engine); err != nil {
		return err
	}
	// A hostPort goes with the sidecar: node traffic must pass it.
	for _, field := range []string{"hostPort", "hostIP"} {
		if err := entry.PipeE(yaml.Clear(field)); err != nil {
			return err
		}
	}
	if _, taken := plan.names[name]; taken {
		return entry.PipeE(yaml.Clear("name"))
	}
	return entry.PipeE(yaml.SetField("name", yaml.NewStringRNode(name)))
}

// portsDeclared tells whether any container of the pod declares a port.
func portsDeclared(pod *yaml.RNode) bool {
	for _, c := range podContainers(pod) {
		if len(containerPorts(c)) > 0 {
			return true
		}
	}
	return false
}

// moveProbes points the engine's probes that tested its old port (by
// number or by name) at the port it listens on now: they go on testing
// the engine itself, not the sidecar in front of it, so a sidecar that
// fails never restarts the engine.
func moveProbes(c *yaml.RNode, old int, name string, moved int) error {
	for _, probe := range []string{"livenessProbe", "readinessProbe", "startupProbe"} {
		for _, handler := range []string{"httpGet", "tcpSocket", "grpc"} {
			h, _ := c.Pipe(yaml.Lookup(probe, handler))
			if h == nil {
				continue
			}
			if v := scalar(h, "port"); v != strconv.Itoa(old) && (name == "" || v != name) {
				continue
			}
			if err := setInt(h, "port", moved); err != nil {
				return err
			}
		}
	}
	return nil
}

// longEnoughGrace gives the pod the time the sidecar needs to drain its
// streams at shutdown (its TIMING_SIDECAR_SHUTDOWN_GRACE and graceMargin,
// at least MinGracePeriod), when it has less.
func longEnoughGrace(pod, sidecar *yaml.RNode) error {
	need := MinGracePeriod
	if e, err := sidecar.Pipe(yaml.Lookup("env", "[name=TIMING_SIDECAR_SHUTDOWN_GRACE]")); err == nil && e != nil {
		if d, err := time.ParseDuration(scalar(e, "value")); err == nil {
			need = max(need, int(math.Ceil(d.Seconds()))+graceMargin)
		}
	}
	if n, err := strconv.Atoi(scalar(pod, "terminationGracePeriodSeconds")); err == nil && n >= need {
		return nil
	}
	return setInt(pod, "terminationGracePeriodSeconds", need)
}
