package inject

import (
	"bytes"
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
// port it takes over, the engine's new one, and the admin port the
// template's probes and port name use. Env may not set them.
var derived = []string{"TIMING_SIDECAR_LISTEN", "TIMING_SIDECAR_UPSTREAM", "TIMING_SIDECAR_ADMIN_LISTEN"}

// ErrNoEngine is the answer to input with no engine in it: a mistake (the
// wrong chart, a values file that renders no engine) more likely than a
// wish to change nothing.
var ErrNoEngine = errors.New("no engine found: no container runs vllm serve, vLLM's OpenAI entrypoint, SGLang's launch_server, llama-server or text-generation-launcher (name one with --engine-container or --engine-port)")

// Inject reads Kubernetes YAML documents from in and writes them to out
// with the sidecar in each pod spec that runs an engine. Nothing is
// written unless every document could be handled. A ResourceList in (a
// KRM function's input, as kustomize gives an exec transformer) comes
// back as a ResourceList.
func Inject(in io.Reader, out io.Writer, opts Options) error {
	for _, v := range opts.Env {
		if slices.Contains(derived, v.Name) {
			return fmt.Errorf("%s is set by inject from the pod (the engine's port, moved; the admin port its probes use), not by a setting", v.Name)
		}
	}
	var buf bytes.Buffer
	rw := &kio.ByteReadWriter{Reader: in, Writer: &buf, PreserveSeqIndent: true}
	docs, err := rw.Read()
	if err != nil {
		return fmt.Errorf("read the manifests: %w", err)
	}
	engines := 0
	for i, doc := range docs {
		for _, ps := range podSpecsOf(doc) {
			found, err := injectPod(ps, &opts)
			if err != nil {
				return fmt.Errorf("document %d (%s %q, %s): %w", i+1, doc.GetKind(), doc.GetName(), ps.path, err)
			}
			if found {
				engines++
			}
		}
	}
	if engines == 0 {
		return ErrNoEngine
	}
	if err := rw.Write(docs); err != nil {
		return err
	}
	_, err = out.Write(buf.Bytes())
	return err
}

// injectPod adds the sidecar to a pod spec that runs an engine, and says
// whether it runs one (already injected or not).
func injectPod(ps podSpec, opts *Options) (bool, error) {
	pod := ps.node
	engineC, eng, injected, err := engineContainer(pod, opts)
	if err != nil || injected || engineC == nil {
		return injected, err
	}
	if scalar(pod, "hostNetwork") == "true" {
		return false, errors.New("the engine's pod is on hostNetwork: its ports are the node's, and moving the engine's could collide with another pod's; add the sidecar by hand")
	}
	old := listenPort(engineC, eng)
	moved, err := freePort(pod, old, AdminPort)
	if err != nil {
		return false, err
	}
	if err := setEnginePort(engineC, eng, moved); err != nil {
		return false, err
	}
	portName, err := moveContainerPort(engineC, old, moved)
	if err != nil {
		return false, err
	}
	if err := moveProbes(engineC, old, portName, moved); err != nil {
		return false, err
	}
	if !portNameFree(pod, portName) {
		// Not the engine's name (renamed above), but another's.
		portName = "timing-http"
	}
	sidecar, err := sidecarContainer(opts, old, portName, moved, ps.native)
	if err != nil {
		return false, err
	}
	list := "initContainers"
	if !ps.native {
		list = "containers"
		// Under Knative one container exposes the port: the sidecar's.
		if err := engineC.PipeE(yaml.Clear("ports")); err != nil {
			return false, err
		}
	}
	target, err := pod.Pipe(yaml.LookupCreate(yaml.SequenceNode, list))
	if err != nil {
		return false, err
	}
	if err := target.PipeE(yaml.Append(sidecar.YNode())); err != nil {
		return false, err
	}
	if !ps.native {
		// KServe's runtime spec has no grace period of its own: Knative's
		// (or the InferenceService's) applies.
		return true, nil
	}
	return true, longEnoughGrace(pod, sidecar)
}

// engineContainer finds the pod's engine container; injected says the pod
// has the sidecar already.
func engineContainer(pod *yaml.RNode, opts *Options) (c *yaml.RNode, e *engine, injected bool, err error) {
	if inits, _ := pod.Pipe(yaml.Lookup("initContainers", "[name="+Name+"]")); inits != nil {
		return nil, nil, true, nil
	}
	containers, err := pod.Pipe(yaml.Lookup("containers"))
	if err != nil {
		return nil, nil, false, err
	}
	elements, err := containers.Elements()
	if err != nil {
		return nil, nil, false, err
	}
	for _, each := range elements {
		if scalar(each, "name") == Name {
			return nil, nil, true, nil
		}
		if found := engineOf(each, opts); found != nil {
			if c != nil {
				return nil, nil, false, fmt.Errorf("two containers could be the engine, %q and %q: name one with --engine-container", scalar(c, "name"), scalar(each, "name"))
			}
			c, e = each, found
		}
	}
	return c, e, false, nil
}

// moveContainerPort moves the engine's containerPort old to moved, under
// the name "engine", and returns the name the old port had ("http" if
// none): the sidecar's port takes it, so Services whose targetPort names
// it reach the sidecar.
func moveContainerPort(c *yaml.RNode, old, moved int) (string, error) {
	ports, _ := c.Pipe(yaml.Lookup("ports"))
	if ports == nil {
		return "http", nil
	}
	elements, _ := ports.Elements()
	for _, p := range elements {
		if scalar(p, "containerPort") != strconv.Itoa(old) {
			continue
		}
		name := scalar(p, "name")
		if name == "" {
			name = "http"
		}
		if err := p.PipeE(yaml.SetField("containerPort", intNode(moved))); err != nil {
			return "", err
		}
		return name, p.PipeE(yaml.SetField("name", yaml.NewStringRNode("engine")))
	}
	return "http", nil
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
			if v := scalar(h, "port"); v != strconv.Itoa(old) && v != name {
				continue
			}
			if err := h.PipeE(yaml.SetField("port", intNode(moved))); err != nil {
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
	return pod.PipeE(yaml.SetField("terminationGracePeriodSeconds", intNode(need)))
}
