package inject

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// found is an engine found in a container: which, where it starts, and
// what it is started with.
type found struct {
	engine *engine
	c      *yaml.RNode
	env    containerEnv
	runs   []*invocation // each start of the engine (a shell line may have several)
}

// A reading is one of the engine's settings as inject read it, and from
// where, to say in a message.
type reading struct {
	value string
	known bool
	from  string // "--port 8000", "LLAMA_ARG_PORT", "vLLM's default"
	// fallback: read from the engine's default or its image's ENV, not
	// from anything the manifest says.
	fallback bool
	// hidden is an argument of the engine's inject cannot read that may
	// hold the setting, when no flag gave it.
	hidden string
	// flags: the occurrences it was read from, to be rewritten.
	flags []flagAt
	env   *envVar // the container's variable it was read from
}

// flagAt is an occurrence of a flag in one start of the engine.
type flagAt struct {
	run *invocation
	flagValue
}

// read reads one setting: the engine's flag (the last of each start, as
// argparse and clap take it, the same in every start), else its variable
// as the engine sees it, else its image's, else the default. hidden says
// the engine's arguments hold what inject cannot read where the flag
// could be.
func (f *found) read(flags []string, envName, def, what string) (reading, error) {
	var r reading
	var last *flagAt
	for _, run := range f.runs {
		all := run.flags(flags)
		for _, v := range all {
			r.flags = append(r.flags, flagAt{run, v})
		}
		if len(all) == 0 {
			continue
		}
		this := &flagAt{run, all[len(all)-1]}
		if last != nil && (this.value != last.value || this.known != last.known) {
			return r, fmt.Errorf("the engine's starts disagree on %s (%q, %q): give every start the same", what, last.raw, this.raw)
		}
		last = this
	}
	if last != nil {
		if f.startsWithout(flags) {
			return r, fmt.Errorf("the engine is started more than once in its shell line, with %s on some starts only: give every start the same %s", flags[0], flags[0])
		}
		r.value, r.known = last.value, last.known
		r.from = flags[0] + " " + last.raw
		if last.inline {
			r.from = last.raw
		}
		return r, nil
	}
	for _, run := range f.runs {
		if h := run.hidden(); h != "" {
			r.hidden = h
		}
	}
	if envName != "" {
		if v, defined, from := f.variable(envName); defined {
			r.value, r.known, r.from = v.value, v.known, from
			if v.node != nil {
				r.env = &v
			}
			return r, nil
		}
		if v, ok := f.engine.imageEnv[envName]; ok && f.engine.imageIs(scalar(f.c, "image")) {
			r.value, r.known, r.from, r.fallback = v, true, envName+" of its image", true
			return r, nil
		}
	}
	r.value, r.known, r.from, r.fallback = def, true, f.engine.name+"'s default", true
	return r, nil
}

// startsWithout tells whether some start of the engine lacks all of flags.
func (f *found) startsWithout(flags []string) bool {
	for _, run := range f.runs {
		if len(run.flags(flags)) == 0 {
			return true
		}
	}
	return false
}

// variable is name as the engine sees it: set on its own command in a
// shell line (read), set elsewhere in the line (not read: the line may
// or may not export it), or the container's.
func (f *found) variable(name string) (envVar, bool, string) {
	for _, run := range f.runs {
		if w, ok := run.prefix[name]; ok {
			return envVar{value: w.value, known: w.known}, true, name + " on its command line"
		}
		if run.assigned[name] {
			return envVar{}, true, name + ", set by the shell line"
		}
	}
	v, defined := f.env.lookup(name)
	return v, defined, name
}

// readPort reads the engine's port setting.
func (f *found) readPort() (reading, error) {
	if name := f.engine.overridingPortEnv; name != "" {
		if v, defined, from := f.variable(name); defined {
			r := reading{value: v.value, known: v.known, from: from}
			if v.node == nil {
				// Not in env, where inject could change it.
				r.known = false
			} else {
				r.env = &v
			}
			return r, nil
		}
	}
	return f.read(f.engine.portFlags, f.engine.portEnv, strconv.Itoa(f.engine.defaultPort), "its port")
}

// port is the port the engine listens on.
func (f *found) port(opts *Options) (int, reading, error) {
	r, err := f.readPort()
	if err != nil {
		return 0, r, err
	}
	if !r.known || r.hidden != "" {
		if opts.EnginePort > 0 {
			return opts.EnginePort, r, nil
		}
		if r.hidden != "" {
			return 0, r, fmt.Errorf("cannot tell the engine's port: its arguments hold %s, which inject cannot read and which may set it; give the port as a flag of its own, or with --engine-port", r.hidden)
		}
		return 0, r, fmt.Errorf("cannot read the engine's port from %s (set from where inject cannot see): write it as a number, or give it with --engine-port", r.from)
	}
	n, err := strconv.Atoi(strings.TrimSpace(r.value))
	if err != nil || n < 1 || n > 65535 {
		return 0, r, fmt.Errorf("the engine's port %s (%q) is not a port number", r.from, r.value)
	}
	if opts.EnginePort > 0 && r.fallback {
		// The engine's default, or its image's: the user knows better.
		return opts.EnginePort, r, nil
	}
	if opts.EnginePort > 0 && opts.EnginePort != n {
		return 0, r, fmt.Errorf("--engine-port %d, but the engine listens on %d (%s): they must agree", opts.EnginePort, n, r.from)
	}
	return n, r, nil
}

// scope is where an address is reachable from.
type scope int

const (
	everyInterface scope = iota // from other pods
	loopbackOnly                // from the pod only
)

// address is where the engine listens: its host's scope, and the
// loopback address the sidecar reaches it on.
type address struct {
	scope    scope
	loopback string // 127.0.0.1 or [::1]
	from     string
}

// address reads the engine's host.
func (f *found) address() (address, error) {
	r, err := f.read(f.engine.hostFlags, f.engine.hostEnv, f.engine.defaultHost, "its host")
	if err != nil {
		return address{}, err
	}
	a := address{loopback: "127.0.0.1", from: r.from}
	if !r.known {
		return a, fmt.Errorf("cannot read the address the engine listens on from %s: write it as an address (0.0.0.0 for every interface, 127.0.0.1 for the pod alone)", r.from)
	}
	host := strings.Trim(strings.TrimSpace(r.value), "[]")
	ip := net.ParseIP(host)
	switch {
	case host == "" || ip != nil && ip.IsUnspecified():
		return a, nil
	case host == "localhost" || ip != nil && ip.IsLoopback():
		a.scope = loopbackOnly
		if ip != nil && ip.To4() == nil {
			a.loopback = "[::1]"
		}
		return a, nil
	case ip == nil && f.engine.name == "TGI":
		// TGI's router binds 0.0.0.0 for a hostname that is no address.
		return a, nil
	}
	return a, fmt.Errorf("the engine listens on %s only (%s): the sidecar can take the place only of an engine on every interface (0.0.0.0) or on loopback (127.0.0.1)", host, r.from)
}

// setPort makes the engine listen on port: each of its port flags says
// it; else the container's variable it read its port from; else every
// start of the engine is given the flag.
func (f *found) setPort(r reading, port int) []edit {
	p := strconv.Itoa(port)
	var edits []edit
	if len(r.flags) > 0 {
		for _, fl := range r.flags {
			text := p
			if fl.inline {
				text = fl.prefix + p
			}
			edits = append(edits, fl.run.setWord(fl.word, text))
		}
		return edits
	}
	if r.env != nil && r.env.known && r.env.node.Field("valueFrom") == nil {
		return []edit{{node: r.env.node.Field("value").Value.YNode(), text: p, whole: true}}
	}
	for _, run := range f.runs {
		if run.shell != nil {
			edits = append(edits, edit{node: run.shell, from: run.end, to: run.end, text: " " + f.engine.portFlags[0] + " " + p})
			continue
		}
		edits = append(edits, edit{appendArgs: []string{f.engine.portFlags[0], p}, container: f.c})
	}
	return edits
}

// leg is the leg of split requests the engine serves, as its legFlag
// says it: prefill or decode, else "".
func (f *found) leg() string {
	if f.engine.legFlag == "" {
		return ""
	}
	for _, run := range f.runs {
		if v, ok := run.flag([]string{f.engine.legFlag}); ok && v.known && (v.value == "prefill" || v.value == "decode") {
			return v.value
		}
	}
	return ""
}
