package inject

import (
	"cmp"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// findEngine finds the engine container of a pod spec: the one
// --engine-container names, else the one that runs a known engine, else
// one the user marked by its port. nil without one.
func findEngine(ps *podSpec, opts *Options) (*found, error) {
	containers, err := ps.node.Pipe(yaml.Lookup("containers"))
	if err != nil || containers == nil {
		return nil, err
	}
	elements, err := containers.Elements()
	if err != nil {
		return nil, err
	}
	if opts.EngineContainer != "" {
		for _, c := range elements {
			if scalar(c, "name") == opts.EngineContainer {
				return engineIn(c, ps, opts, true)
			}
		}
	}
	var out *found
	var mentioned error
	for _, c := range elements {
		f, err := engineIn(c, ps, opts, false)
		var m mention
		switch {
		case errors.As(err, &m):
			// Only if no container is the engine: a helper's echo
			// naming the engine blocks nothing.
			mentioned = cmp.Or(mentioned, fmt.Errorf("container %q: %w", scalar(c, "name"), err))
			continue
		case err != nil:
			return nil, fmt.Errorf("container %q: %w", scalar(c, "name"), err)
		case f == nil:
			continue
		case out != nil:
			return nil, fmt.Errorf("two containers could be the engine, %q and %q: name one with --engine-container", scalar(out.c, "name"), scalar(c, "name"))
		}
		out = f
	}
	if out == nil && mentioned != nil {
		return nil, mentioned
	}
	return out, nil
}

// engineIn tells whether c runs an engine, and how; named says the user
// named it. A known engine is recognised by its program, else by its
// image; a container that names one where inject cannot read it is
// refused; one the user marked, by name or port, is an engine inject does
// not know.
func engineIn(c *yaml.RNode, ps *podSpec, opts *Options, named bool) (*found, error) {
	for _, field := range []string{"command", "args"} {
		if f := c.Field(field); f != nil && f.Value.YNode().Kind != yaml.SequenceNode && !yaml.IsMissingOrNull(f.Value) {
			return nil, fmt.Errorf("its %s is not a list", field)
		}
	}
	env := envOf(c, ps)
	runs, parseErr := runsOf(c, env)
	if env.spent() {
		return nil, errTooMuchExpanded
	}
	f := &found{c: c, env: env}
	if err := f.knownEngine(runs); err != nil {
		return nil, err
	}
	if f.engine == nil && parseErr == nil && len(runs) == 1 && runs[0].shell == nil {
		f.byImage(runs)
	}
	if f.engine != nil {
		return f, nil
	}
	if err := unreadable(c, parseErr, named); err != nil || parseErr != nil {
		return nil, err
	}
	byPort := opts.EnginePort > 0 && hasPort(c, opts.EnginePort)
	if (!named && !byPort) || isRouter(c) {
		return nil, nil
	}
	return f.unknownEngine(runs)
}

// knownEngine finds the known engine among runs' programs, keeping the
// runs that start it; two different engines in one container are refused.
func (f *found) knownEngine(runs []*invocation) error {
	for i := range engines {
		e := &engines[i]
		for _, run := range runs {
			args, ok := e.startedBy(run.words)
			if !ok {
				continue
			}
			if f.engine != nil && f.engine != e {
				return fmt.Errorf("runs both %s and %s", f.engine.name, e.name)
			}
			run.args, f.engine = args, e
			f.runs = append(f.runs, run)
		}
	}
	return nil
}

// startedBy is where e's arguments begin in words, if words start it.
func (e *engine) startedBy(words []word) (args int, ok bool) {
	for at := range words {
		if args, ok := e.programAt(words, at); ok {
			return args, true
		}
	}
	return 0, false
}

// byImage takes the engine whose image c runs without a command of its
// own: the image's entrypoint starts it.
func (f *found) byImage(runs []*invocation) {
	for i := range engines {
		if engines[i].runByImage(f.c) {
			f.engine, f.runs = &engines[i], runs
		}
	}
}

// unreadable is the refusal of a container with no engine inject could
// read: one whose text names an engine it cannot place a port in (nested
// in another shell's quotes, started through eval or a variable), or a
// shell line that does not parse in the container the user named.
func unreadable(c *yaml.RNode, parseErr error, named bool) error {
	if name := engineMention(c); name != "" && !named {
		reason := "its command names " + name + " but runs it where inject cannot place a port safely (inside another shell's quotes, through eval or a variable)"
		if parseErr != nil {
			reason = parseErr.Error()
		}
		return mention{reason + ": write the engine's start as a command of its own, or add the sidecar by hand; if this container is not the engine, name the engine's with --engine-container"}
	}
	if named {
		return parseErr
	}
	return nil
}

// unknownEngine takes the container the user marked as an engine inject
// does not know, moved through its one start with a --port.
func (f *found) unknownEngine(runs []*invocation) (*found, error) {
	f.engine = &unknownEngine
	for _, run := range runs {
		if run.shell == nil && len(stringsOf(f.c, "command")) > 0 {
			run.args = 1 // the program's name
		}
		if len(run.flags(unknownEngine.portFlags)) > 0 {
			f.runs = append(f.runs, run)
		}
	}
	switch len(f.runs) {
	case 0:
		return nil, errors.New("the engine named by --engine-container or --engine-port has no --port flag inject can rewrite: inject moves an engine it does not know only through its own --port")
	case 1:
		return f, nil
	}
	return nil, fmt.Errorf("%d commands in the container's shell line have a --port: inject cannot tell which is the engine; start it in a container of its own, or add the sidecar by hand", len(f.runs))
}

// mention is the refusal of a container that names an engine where
// inject cannot place a port.
type mention struct{ reason string }

func (m mention) Error() string { return m.reason }

// engineMention is the first engine program named anywhere in c's command
// and args, "" for none.
func engineMention(c *yaml.RNode) string {
	line := strings.Join(append(stringsOf(c, "command"), stringsOf(c, "args")...), " ")
	for _, e := range engines {
		for _, p := range e.programs {
			if m := strings.Join(p, " "); strings.Contains(line, m) {
				return m
			}
		}
	}
	return ""
}

// Placements of the sidecar in a pod where a routing sidecar fronts the
// engine.
const (
	// PlacementFront puts it in front of the routing sidecar: it sees the
	// client's whole request, and its TTFT is the client's.
	PlacementFront = "front"
	// PlacementEngine puts it between the routing sidecar and the engine:
	// it sees the decode leg.
	PlacementEngine = "engine"
)

// frontOf is what the sidecar stands in front of in a pod spec: the
// engine, or, with PlacementFront, a plain-HTTP llm-d routing sidecar in
// front of that engine.
func frontOf(ps *podSpec, opts *Options) (*found, error) {
	f, err := findEngine(ps, opts)
	if err != nil || f == nil || opts.Placement == PlacementEngine {
		return f, err
	}
	port, _, err := f.port(opts)
	if err != nil {
		return f, nil // the engine's own refusal comes when it is placed
	}
	for _, c := range podContainers(ps.node) {
		if !routingSidecar.imageIs(scalar(c, "image")) {
			continue
		}
		env := envOf(c, ps)
		runs, err := runsOf(c, env)
		if err != nil || len(runs) != 1 || runs[0].shell != nil {
			continue
		}
		run := runs[0]
		if len(stringsOf(c, "command")) > 0 {
			run.args = 1
		}
		r := &found{engine: &routingSidecar, c: c, env: env, runs: runs}
		if !plainHTTP(run) || !fronts(run, port) {
			continue
		}
		return r, nil
	}
	return f, nil
}

// plainHTTP tells a routing sidecar started with --secure-proxy=false.
// It parses flags with Go's flag package, where a boolean takes a value
// only after "=": "--secure-proxy false" is TLS on, and ends the flags.
func plainHTTP(run *invocation) bool {
	v, ok := run.flag([]string{"--secure-proxy", "-secure-proxy"})
	if !ok || !v.known || !v.inline {
		return false
	}
	on, err := strconv.ParseBool(v.value)
	return err == nil && !on
}

// fronts tells a routing sidecar that relays to the engine on port.
func fronts(run *invocation, port int) bool {
	v, ok := run.flag([]string{"--vllm-port", "-vllm-port"})
	return ok && v.known && v.value == strconv.Itoa(port)
}
