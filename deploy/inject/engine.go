package inject

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// An engine is known by the program its container runs, or by an image
// whose entrypoint runs it when the container sets no command; it
// listens, when its command says no --port, on that program's default
// port.
type engine struct {
	name        string
	markers     []string // any of these in the command line
	images      []string // images whose entrypoint is the engine
	defaultPort int
}

var engines = []engine{
	{"vLLM", []string{"vllm serve", "vllm.entrypoints.openai.api_server"}, []string{"vllm/vllm-openai"}, 8000},
	{"SGLang", []string{"sglang.launch_server"}, nil, 30000},
	{"llama.cpp", []string{"llama-server"}, []string{"ggml-org/llama.cpp:server"}, 8080},
	{"TGI", []string{"text-generation-launcher"}, []string{"huggingface/text-generation-inference"}, 80},
}

// routers are programs that serve an engine's API in front of engines
// (production-stack's router, llm-d's routing proxy, gateways): never an
// engine, whatever port they listen on.
var routers = []string{"vllm_router", "vllm-router", "llm-d-routing-sidecar", "routing-proxy", "envoy", "gateway"}

// commandLine is a container's command and args, as one line.
func commandLine(c *yaml.RNode) string {
	return strings.Join(append(stringsOf(c, "command"), stringsOf(c, "args")...), " ")
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

// engineOf tells which engine a container runs, by its command, or by
// the name or port the user named; nil for one that runs none.
func engineOf(c *yaml.RNode, opts *Options) *engine {
	line := commandLine(c)
	for i := range engines {
		for _, m := range engines[i].markers {
			if strings.Contains(line, m) {
				return &engines[i]
			}
		}
	}
	if len(stringsOf(c, "command")) == 0 {
		// The image's entrypoint runs: the engine's, for these images.
		image := scalar(c, "image")
		for i := range engines {
			for _, m := range engines[i].images {
				if strings.Contains(image, m) {
					return &engines[i]
				}
			}
		}
	}
	named := opts.EngineContainer != "" && scalar(c, "name") == opts.EngineContainer
	byPort := opts.EnginePort > 0 && hasPort(c, opts.EnginePort)
	if !named && !byPort {
		return nil
	}
	image := scalar(c, "image")
	for _, r := range routers {
		if strings.Contains(line, r) || strings.Contains(image, r) {
			return nil
		}
	}
	return &engine{name: "the engine", defaultPort: opts.EnginePort}
}

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

// scalar is the value of the scalar at path in n, "" if there is none.
func scalar(n *yaml.RNode, path ...string) string {
	v, err := n.Pipe(yaml.Lookup(path...))
	if err != nil || v == nil || v.YNode().Kind != yaml.ScalarNode {
		return ""
	}
	return v.YNode().Value
}

// intNode is an integer scalar.
func intNode(n int) *yaml.RNode {
	return yaml.NewRNode(&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(n)})
}

// portFlag finds a --port flag and its value: "--port 8000" or
// "--port=8000", with the value's span in s.
var portFlag = regexp.MustCompile(`(^|[\s"'])--port(?:=|\s+)(\d+)`)

// listenPort is the port the engine listens on: its --port, else its
// container's first port, else its program's default.
func listenPort(c *yaml.RNode, e *engine) int {
	if m := portFlag.FindStringSubmatch(engineSegment(c, e)); m != nil {
		n, _ := strconv.Atoi(m[2])
		return n
	}
	if ports := containerPorts(c); len(ports) > 0 {
		return ports[0]
	}
	return e.defaultPort
}

// engineSegment is the part of the container's command line that runs the
// engine: in a shell line, the command between its separators.
func engineSegment(c *yaml.RNode, e *engine) string {
	for _, s := range append(stringsOf(c, "command"), stringsOf(c, "args")...) {
		if at, ok := markerAt(s, e); ok && isShellLine(s) {
			from, to := segment(s, at)
			return s[from:to]
		}
	}
	return commandLine(c)
}

func markerAt(s string, e *engine) (int, bool) {
	for _, m := range e.markers {
		if i := strings.Index(s, m); i >= 0 {
			return i, true
		}
	}
	return 0, false
}

// isShellLine tells whether one command or args element is a shell line
// (sh -c "...") rather than one argument.
func isShellLine(s string) bool { return strings.ContainsAny(s, " \t\n") }

// segment is the span of the shell command around at: from the separator
// before it (;, &&, ||, |, &, or a line break not escaped by a backslash)
// to the one after.
func segment(s string, at int) (int, int) {
	from := 0
	for i := at - 1; i >= 0; i-- {
		if isSeparator(s, i) {
			from = i + 1
			break
		}
	}
	to := len(s)
	for i := at; i < len(s); i++ {
		if isSeparator(s, i) {
			to = i
			break
		}
	}
	return from, to
}

func isSeparator(s string, i int) bool {
	switch s[i] {
	case ';', '|', '&':
		return true
	case '\n':
		return i == 0 || s[i-1] != '\\'
	}
	return false
}

// setEnginePort makes the engine listen on port: its --port rewritten
// where the engine's command has one (only the engine's own, in a shell
// line), else added to it.
func setEnginePort(c *yaml.RNode, e *engine, port int) error {
	for _, field := range []string{"command", "args"} {
		f := c.Field(field)
		if f == nil {
			continue
		}
		for _, n := range f.Value.YNode().Content {
			at, ok := markerAt(n.Value, e)
			if !ok || !isShellLine(n.Value) {
				continue
			}
			from, to := segment(n.Value, at)
			n.Value = n.Value[:from] + withPort(n.Value[from:to], port) + n.Value[to:]
			return nil
		}
	}
	// A list of arguments: --port and its value, or --port=value.
	for _, field := range []string{"command", "args"} {
		f := c.Field(field)
		if f == nil {
			continue
		}
		items := f.Value.YNode().Content
		for i, n := range items {
			switch {
			case n.Value == "--port" && i+1 < len(items):
				items[i+1].Value, items[i+1].Tag, items[i+1].Style = strconv.Itoa(port), "!!str", yaml.DoubleQuotedStyle
				return nil
			case strings.HasPrefix(n.Value, "--port="):
				n.Value = "--port=" + strconv.Itoa(port)
				return nil
			}
		}
	}
	// None: added to the arguments.
	args := c.Field("args")
	if args == nil {
		if err := c.PipeE(yaml.SetField("args", yaml.NewListRNode())); err != nil {
			return err
		}
		args = c.Field("args")
	}
	return args.Value.PipeE(yaml.Append(quoted("--port"), quoted(strconv.Itoa(port))))
}

// withPort is a shell command with its --port set to port, or added at
// its end.
func withPort(cmd string, port int) string {
	if loc := portFlag.FindStringSubmatchIndex(cmd); loc != nil {
		return cmd[:loc[4]] + strconv.Itoa(port) + cmd[loc[5]:]
	}
	trimmed := strings.TrimRight(cmd, " \t")
	return trimmed + " --port " + strconv.Itoa(port) + cmd[len(trimmed):]
}

func quoted(s string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s, Style: yaml.DoubleQuotedStyle}
}

// portNameFree tells whether no container of the pod has a port named
// name (port names are the pod's, and unique in it).
func portNameFree(pod *yaml.RNode, name string) bool {
	for _, c := range podContainers(pod) {
		if p, _ := c.Pipe(yaml.Lookup("ports", "[name="+name+"]")); p != nil {
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

// freePort is a port nothing in the pod uses: from + 10000, or the next
// one free.
func freePort(pod *yaml.RNode, from int, taken ...int) (int, error) {
	used := map[int]bool{}
	for _, p := range taken {
		used[p] = true
	}
	for _, c := range podContainers(pod) {
		for _, p := range containerPorts(c) {
			used[p] = true
		}
	}
	for p := from + 10000; p < 65536; p++ {
		if !used[p] {
			return p, nil
		}
	}
	for p := 1024; p < from; p++ {
		if !used[p] {
			return p, nil
		}
	}
	return 0, fmt.Errorf("no free port in the pod")
}
