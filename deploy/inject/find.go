package inject

import (
	"fmt"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// findEngine finds the engine container of a pod spec: the one
// --engine-container names, else the one that runs a known engine, else
// one the user marked by name or port. nil without one.
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
	for _, c := range elements {
		f, err := engineIn(c, ps, opts, false)
		if err != nil {
			return nil, fmt.Errorf("container %q: %w", scalar(c, "name"), err)
		}
		if f == nil {
			continue
		}
		if out != nil {
			return nil, fmt.Errorf("two containers could be the engine, %q and %q: name one with --engine-container", scalar(out.c, "name"), scalar(c, "name"))
		}
		out = f
	}
	return out, nil
}

// engineIn tells whether c runs an engine, and how; named says the user
// named it.
func engineIn(c *yaml.RNode, ps *podSpec, opts *Options, named bool) (*found, error) {
	env := envOf(c)
	runs, script, parseErr := runsOf(c, env)
	f := &found{c: c, env: env, script: script}
	for i := range engines {
		e := &engines[i]
		for _, run := range runs {
			for at := range run.words {
				if args, ok := e.programAt(run.words, at); ok {
					if f.engine != nil && f.engine != e {
						return nil, fmt.Errorf("runs both %s and %s", f.engine.name, e.name)
					}
					run.args, f.engine = args, e
					f.runs = append(f.runs, run)
					break
				}
			}
		}
	}
	if f.engine == nil && parseErr == nil && len(runs) == 1 && runs[0].shell == nil {
		for i := range engines {
			if engines[i].runByImage(c) {
				f.engine, f.runs = &engines[i], runs
			}
		}
	}
	if f.engine != nil {
		return f, nil
	}
	// Neither a known engine nor a shell line inject could read: an
	// engine's name in the text means an engine it cannot place a port
	// in (nested in another shell's quotes, started through eval or a
	// variable).
	if mention := engineMention(c); mention != "" {
		reason := "its command names " + mention + " but runs it where inject cannot place a port safely (inside another shell's quotes, through eval or a variable)"
		if parseErr != nil {
			reason = parseErr.Error()
		}
		return nil, fmt.Errorf("%s: write the engine's start as a command of its own, or add the sidecar by hand", reason)
	}
	if parseErr != nil {
		return nil, nil
	}
	byPort := opts.EnginePort > 0 && hasPort(c, opts.EnginePort)
	if (!named && !byPort) || isRouter(c) {
		return nil, nil
	}
	// An engine inject does not know: the one start with a --port.
	f.engine = &unknownEngine
	for _, run := range runs {
		if run.shell == nil {
			run.args = 1
		}
		if len(run.flags(unknownEngine.portFlags)) > 0 {
			f.runs = append(f.runs, run)
		}
	}
	if len(f.runs) != 1 {
		return nil, errNoPortFlag
	}
	return f, nil
}

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

func stringsOf(c *yaml.RNode, field string) []string {
	f := c.Field(field)
	if f == nil {
		return nil
	}
	var out []string
	for _, n := range f.Value.YNode().Content {
		out = append(out, n.Value)
	}
	return out
}
