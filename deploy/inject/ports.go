package inject

import (
	"fmt"
	"maps"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// knativeReserved are the ports Knative Serving keeps for its queue-proxy
// and profiling (knative/serving pkg/apis/serving/k8s_validation.go,
// reservedPorts): no container of a Knative pod may declare them, and
// nothing inject moves may listen on them.
var knativeReserved = []int{8008, 8012, 8013, 8022, 9090, 9091}

// podPorts is what the pod's containers hold or may bind: every
// containerPort and hostPort, every port in a program's arguments and
// env that it may listen on, and every port name; each with who holds
// it, for messages.
type podPorts struct {
	used  map[int]string
	names map[string]string
	// mayBind are ports read from text (an address, a JSON field) that a
	// program may or may not bind: never chosen, but no reason to refuse
	// a port the user chose.
	mayBind map[int]string
}

// portsOf reads the ports of every container and init container of a pod
// spec.
func portsOf(ps *podSpec) podPorts {
	p := podPorts{used: map[int]string{}, names: map[string]string{}, mayBind: map[int]string{}}
	for _, c := range podContainers(ps.node) {
		who := "container " + strconv.Quote(scalar(c, "name"))
		p.declared(c, who)
		env := envOf(c, ps)
		p.fromEnv(env, who)
		runs, _ := runsOf(c, env)
		for _, run := range runs {
			p.fromWords(run.words, who)
		}
	}
	if ps.knative {
		for _, n := range knativeReserved {
			p.use(n, "Knative (a reserved port)")
		}
	}
	return p
}

// declared records c's containerPorts, hostPorts and port names.
func (p podPorts) declared(c *yaml.RNode, who string) {
	list, _ := c.Pipe(yaml.Lookup("ports"))
	if list == nil {
		return
	}
	items, _ := list.Elements()
	for _, item := range items {
		for _, field := range []string{"containerPort", "hostPort"} {
			if n, err := strconv.Atoi(scalar(item, field)); err == nil {
				p.use(n, who+"'s "+field)
			}
		}
		if name := scalar(item, "name"); name != "" {
			p.names[name] = who
		}
	}
}

// addressPort is a port in an address to listen on (":8000",
// "0.0.0.0:8000", "[::]:8000"; a URL's port too, which costs only a port
// not chosen), and jsonPort one in a JSON argument ("kv_port": 18000).
var (
	addressPort = regexp.MustCompile(`:(\d{1,5})\b`)
	jsonPort    = regexp.MustCompile(`(?i)"[a-z0-9_.-]*port"\s*:\s*"?(\d{1,5})`)
)

// fromWords records the ports a program's words may bind: a --...port
// flag's value ("--port 8000", "--kv-port=8000"), and the ports of
// addresses and JSON port fields anywhere in them.
func (p podPorts) fromWords(words []word, who string) {
	for i, w := range words {
		name, value, inline := strings.Cut(w.value, "=")
		if !inline && i+1 < len(words) {
			value = words[i+1].value
		}
		if strings.HasPrefix(name, "--") && strings.HasSuffix(name, "port") {
			if n, err := strconv.Atoi(value); err == nil {
				p.use(n, who+"'s "+name)
			}
		}
		p.inText(w.value, who+"'s arguments")
	}
}

// fromEnv records the ports of env: a PORT or *_PORT variable's value,
// and the ports of addresses in any value.
func (p podPorts) fromEnv(env containerEnv, who string) {
	for _, name := range slices.Sorted(maps.Keys(env.vars)) {
		v := env.vars[name]
		if !v.known {
			continue
		}
		if name == "PORT" || strings.HasSuffix(strings.ToUpper(name), "_PORT") {
			if n, err := strconv.Atoi(strings.TrimSpace(v.value)); err == nil {
				p.use(n, who+"'s "+name)
			}
		}
		p.inText(v.value, who+"'s "+name)
	}
}

// inText records the ports of addresses and JSON port fields in s as
// ports a program may bind.
func (p podPorts) inText(s, who string) {
	for _, re := range []*regexp.Regexp{addressPort, jsonPort} {
		for _, m := range re.FindAllStringSubmatch(s, -1) {
			if n, err := strconv.Atoi(m[1]); err == nil && n > 0 && n < 65536 {
				if _, ok := p.mayBind[n]; !ok {
					p.mayBind[n] = who
				}
			}
		}
	}
}

// use records that who holds port, the first holder kept.
func (p podPorts) use(port int, who string) {
	if _, ok := p.used[port]; !ok {
		p.used[port] = who
	}
}

// free is the first port from `from` up that nothing holds, wrapping to
// 1024, with nothing at its offsets from it either (ports a program
// listens on relative to its own).
func (p podPorts) free(from int, offsets ...int) (int, error) {
	for _, r := range [][2]int{{from, 65536}, {1024, from}} {
		for n := r[0]; n < r[1]; n++ {
			if p.freeAt(n, offsets) {
				return n, nil
			}
		}
	}
	return 0, fmt.Errorf("no free port in the pod")
}

func (p podPorts) freeAt(n int, offsets []int) bool {
	for _, d := range append([]int{0}, offsets...) {
		_, held := p.used[n+d]
		_, may := p.mayBind[n+d]
		if held || may || n+d > 65535 {
			return false
		}
	}
	return true
}

// podContainers is a pod's containers and init containers.
func podContainers(pod *yaml.RNode) []*yaml.RNode {
	var all []*yaml.RNode
	for _, list := range []string{"containers", "initContainers"} {
		if cs, _ := pod.Pipe(yaml.Lookup(list)); cs != nil {
			elements, _ := cs.Elements()
			all = append(all, elements...)
		}
	}
	return all
}

// hasPort tells whether c declares containerPort port.
func hasPort(c *yaml.RNode, port int) bool {
	for _, p := range containerPorts(c) {
		if p == port {
			return true
		}
	}
	return false
}

// containerPorts is a container's containerPort numbers.
func containerPorts(c *yaml.RNode) []int {
	ports, _ := c.Pipe(yaml.Lookup("ports"))
	if ports == nil {
		return nil
	}
	var out []int
	elements, _ := ports.Elements()
	for _, p := range elements {
		if n, err := strconv.Atoi(scalar(p, "containerPort")); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// probePorts is the ports c's probes test, names resolved through c's
// ports.
func probePorts(c *yaml.RNode) []int {
	var out []int
	for _, probe := range []string{"livenessProbe", "readinessProbe", "startupProbe"} {
		for _, handler := range []string{"httpGet", "tcpSocket", "grpc"} {
			v := scalar(c, probe, handler, "port")
			if v == "" {
				continue
			}
			if n, err := strconv.Atoi(v); err == nil {
				out = append(out, n)
				continue
			}
			if p, _ := c.Pipe(yaml.Lookup("ports", "[name="+v+"]")); p != nil {
				if n, err := strconv.Atoi(scalar(p, "containerPort")); err == nil {
					out = append(out, n)
				}
			}
		}
	}
	return out
}

// portPlan is where each part listens once the sidecar is in.
type portPlan struct {
	// listen is the engine's port, the sidecar's now; listenName its name
	// in the engine's ports ("" when undeclared or unnamed), hostPort the
	// node's port that led to it.
	listen           int
	listenName       string
	declared         bool
	hostPort, hostIP string
	// engine is the engine's new port, and engineReading where its old
	// one was read, to be rewritten.
	engine        int
	engineReading reading
	addr          address
	// admin is the sidecar's admin port; adminSet says the user chose it.
	admin    int
	adminSet bool
	names    map[string]string // the pod's port names, and whose
	// leg is the leg of split requests the engine serves, "" for none.
	leg string
}

// planPorts reads where the engine listens and chooses the ports the
// engine and the sidecar's admin move to, none held by anything in the
// pod.
func planPorts(ps *podSpec, f *found, opts *Options) (*portPlan, error) {
	old, r, err := f.port(opts)
	if err != nil {
		return nil, err
	}
	if err := checkDeclared(f, old, r, opts); err != nil {
		return nil, err
	}
	addr, err := f.address()
	if err != nil {
		return nil, err
	}
	used := portsOf(ps)
	plan := &portPlan{listen: old, engineReading: r, addr: addr, names: used.names, leg: f.leg()}
	if entry, _ := f.c.Pipe(yaml.Lookup("ports", "[containerPort="+strconv.Itoa(old)+"]")); entry != nil {
		plan.declared, plan.listenName = true, scalar(entry, "name")
		plan.hostPort, plan.hostIP = scalar(entry, "hostPort"), scalar(entry, "hostIP")
	}
	if old < 1024 && ps.knative {
		return nil, fmt.Errorf("the engine listens on %d: the sidecar, not root, cannot bind a port below 1024 under Knative, which refuses the pod sysctl that would let it; serve the engine on a port from 1024", old)
	}
	used.use(old, "the engine")
	for _, n := range f.engine.impliedPorts {
		used.use(n, f.engine.name+" by default")
	}
	if who, taken := used.names[adminPortName]; taken && !ps.knative {
		return nil, fmt.Errorf("%s already has a port named %s, the sidecar's admin port: rename it (a sidecar added by hand under another name?)", who, adminPortName)
	}
	plan.admin, plan.adminSet, err = adminPort(opts)
	if err != nil {
		return nil, err
	}
	if who, taken := used.used[plan.admin]; taken && plan.adminSet {
		return nil, fmt.Errorf("admin-listen's port %d is held by %s: choose another", plan.admin, who)
	}
	if !plan.adminSet {
		if plan.admin, err = used.free(AdminPort); err != nil {
			return nil, err
		}
	}
	used.use(plan.admin, "the sidecar's admin port")
	from := old + 10000
	if from > 65535 {
		from = 1024
	}
	shifted := f.engine.shiftedPorts
	if _, set := f.env.vars[f.engine.shiftedEnv]; set {
		shifted = nil // its own variable's port, counted among the env's
	}
	if plan.engine, err = used.free(from, shifted...); err != nil {
		return nil, err
	}
	return plan, nil
}

// adminPort is the sidecar's admin port: the one admin-listen sets, else
// AdminPort.
func adminPort(opts *Options) (int, bool, error) {
	for _, v := range opts.Env {
		if v.Name != "TIMING_SIDECAR_ADMIN_LISTEN" {
			continue
		}
		host, port, err := net.SplitHostPort(v.Value)
		n, perr := strconv.Atoi(port)
		if err != nil || perr != nil || n < 1 || n > 65535 {
			return 0, false, fmt.Errorf("admin-listen %q is not HOST:PORT", v.Value)
		}
		if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() {
			return 0, false, fmt.Errorf("admin-listen %q is on loopback, where the kubelet's probes of /readyz and /healthz cannot reach it: listen on every interface (:%d)", v.Value, n)
		}
		return n, true, nil
	}
	return AdminPort, false, nil
}

// checkDeclared refuses an engine whose port inject took from its
// default while its container says otherwise: declared ports that do not
// include it, or probes that test another port. Then the engine reads
// its port from where inject cannot see (its image's environment, a
// config file), and moving it would be a guess.
func checkDeclared(f *found, port int, r reading, opts *Options) error {
	if !r.fallback || opts.EnginePort > 0 {
		return nil
	}
	why := ""
	if declared := containerPorts(f.c); len(declared) > 0 && !slices.Contains(declared, port) {
		why = fmt.Sprintf("its container declares %v", declared)
	}
	for _, p := range probePorts(f.c) {
		if p != port {
			why = fmt.Sprintf("its probes test %d", p)
		}
	}
	if why == "" {
		return nil
	}
	return fmt.Errorf("%s listens on %d (%s), but %s: give the engine its port with %s, or name it with --engine-port", f.engine.name, port, r.from, why, f.engine.portFlags[0])
}
