package inject

import (
	"fmt"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// containerEnv is a container's environment as the kubelet builds it,
// for what inject reads from it: each variable's value where the manifest
// gives it, and where it comes from otherwise.
type containerEnv struct {
	vars map[string]envVar
	// open: the container has envFrom, so a name not in vars may be
	// defined all the same, with a value inject cannot see.
	open bool
	// budget is what expansion may still write for the container
	// (maxExpanded), shared by every copy of its env.
	budget *int
}

// envVar is one variable of a container's env.
type envVar struct {
	value string // as the kubelet expands it, when known
	known bool
	node  *yaml.RNode // its entry in env, to change its value
}

// envOf reads c's environment as the kubelet builds it: first envFrom,
// each source in order, then env in order, each value expanded against
// the variables before it. A source that is a ConfigMap in the input is
// read; any other leaves the environment open.
func envOf(c *yaml.RNode, ps *podSpec) containerEnv {
	e := containerEnv{vars: map[string]envVar{}, budget: new(int)}
	*e.budget = maxExpanded
	e.open = e.fromSources(c, ps)
	list, _ := c.Pipe(yaml.Lookup("env"))
	if list == nil {
		return e
	}
	items, _ := list.Elements()
	for _, item := range items {
		name := scalar(item, "name")
		v := envVar{node: item}
		if item.Field("valueFrom") == nil {
			// A missing value is the empty string.
			v.value, v.known = e.expand(scalar(item, "value"))
		}
		e.vars[name] = v
	}
	return e
}

// fromSources takes the variables of c's envFrom from the input's
// ConfigMaps (their values as written: the kubelet expands none), and
// tells whether some source is not one of them: a Secret, a ConfigMap
// from elsewhere. Such a source may set any variable, those of the
// sources before it included.
func (e containerEnv) fromSources(c *yaml.RNode, ps *podSpec) (open bool) {
	f := c.Field("envFrom")
	if f == nil || yaml.IsMissingOrNull(f.Value) {
		return false
	}
	sources, err := f.Value.Elements()
	if err != nil {
		return true
	}
	for _, source := range sources {
		data, ok := ps.configMaps.lookup(scalar(source, "configMapRef", "name"), ps.namespace)
		if !ok || source.Field("secretRef") != nil {
			// A later source overrides an earlier one: what the
			// earlier ones set may be this one's.
			for k := range e.vars {
				e.vars[k] = envVar{}
			}
			open = true
			continue
		}
		prefix := scalar(source, "prefix")
		for k, v := range data {
			e.vars[prefix+k] = envVar{value: v, known: true}
		}
	}
	return open
}

// spend takes n bytes of the container's expansion budget, if there are.
// An env made without one (a test's) has no bound.
func (e containerEnv) spend(n int) bool {
	if e.budget == nil {
		return true
	}
	if *e.budget < n {
		*e.budget = 0
		return false
	}
	*e.budget -= n
	return true
}

// spent tells an env whose expansion used its whole budget.
func (e containerEnv) spent() bool { return e.budget != nil && *e.budget == 0 }

// errTooMuchExpanded refuses a container whose env and command, as the
// kubelet expands them, pass what the kernel gives a program.
var errTooMuchExpanded = fmt.Errorf("its env and command expand past %d MiB, more than the kernel passes a program (E2BIG): it could not start", maxExpanded>>20)

// lookup is name's value as the container sees it: defined says whether
// the container surely has it (or may, with envFrom: then defined and
// not known).
func (e containerEnv) lookup(name string) (v envVar, defined bool) {
	if v, ok := e.vars[name]; ok {
		return v, true
	}
	if e.open {
		return envVar{}, true
	}
	return envVar{}, false
}

// expand applies the kubelet's expansion of $(VAR) in command, args and
// env values to s (Kubernetes' third_party/forked/golang/expansion,
// Expand): $(VAR) of a defined variable is its value, of an undefined one
// stays as written; $$ is $; any other $ is itself. known is false where
// a variable's value cannot be read from the manifest, and for a variable
// the manifest does not define: controllers define some when they create
// the pod (LeaderWorkerSet's LWS_WORKER_INDEX, Knative's PORT).
func (e containerEnv) expand(s string) (string, bool) {
	if !strings.Contains(s, "$") {
		return s, true
	}
	var b strings.Builder
	known := true
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString("$(")
				i++
				continue
			}
			name := s[i+2 : i+2+end]
			v, defined := e.lookup(name)
			switch {
			case !defined, !v.known:
				known = false
				b.WriteString(unknownPart)
			case b.Len()+len(v.value) > maxArg || !e.spend(len(v.value)):
				// Values built of values double at each step, and many
				// values repeat a large one: the kernel would refuse the
				// result (E2BIG), and inject reads none.
				return unknownPart, false
			default:
				b.WriteString(v.value)
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String(), known
}
