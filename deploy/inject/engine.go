package inject

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// An engine is known by the program its container runs, or by an image
// whose entrypoint runs it when the container sets no command. Where it
// listens is read as the engine reads it: its flags, then its environment
// (the container's, then its image's), then its documented default.
type engine struct {
	name string
	// programs name it on a command line: word sequences, the first word
	// matched by its base name (/usr/local/bin/vllm is vllm).
	programs [][]string
	// images run it as their entrypoint; imageEnv is what those images'
	// ENV sets.
	images   []string
	imageEnv map[string]string
	// portFlags and hostFlags are its options for where it listens, in
	// their long and short forms; portEnv and hostEnv the variables it
	// reads when they are not given.
	portFlags, hostFlags []string
	portEnv, hostEnv     string
	// overridingPortEnv, where the container sets it, is the port
	// whatever the flags say.
	overridingPortEnv string
	// impliedPorts are other ports it listens on by default; shiftedPorts
	// are offsets from its own port where it listens too, unless
	// shiftedEnv names the port instead, so that a port it moves to must
	// have those free too.
	impliedPorts []int
	shiftedPorts []int
	shiftedEnv   string
	// httpOff are its flags that make it serve no HTTP API, which the
	// sidecar relays.
	httpOff     []string
	defaultPort int
	defaultHost string // "" is every interface
	// worker tells a node of a multi-node engine that serves no API.
	worker func(run *invocation, in *podSpec) (bool, error)
	// movedName names its moved port ("engine" when empty).
	movedName string
	// legFlag is its option saying which leg of split requests it serves
	// (prefill or decode), passed to the sidecar as its disaggregation
	// leg.
	legFlag string
}

var engines = []engine{
	{
		// vLLM: vllm/entrypoints/openai/cli_args.py (host None is every
		// interface, port 8000).
		name:        "vLLM",
		programs:    [][]string{{"vllm", "serve"}, {"vllm.entrypoints.openai.api_server"}},
		images:      []string{"vllm/vllm-openai"},
		portFlags:   []string{"--port"},
		hostFlags:   []string{"--host"},
		defaultPort: 8000,
		worker:      vllmHeadless,
	},
	{
		// SGLang: python/sglang/srt/server_args.py (host 127.0.0.1, port
		// 30000); its gRPC server listens on SGLANG_GRPC_PORT, else its
		// port + 10000, and with --grpc-mode it serves gRPC alone.
		name:         "SGLang",
		programs:     [][]string{{"sglang.launch_server"}},
		portFlags:    []string{"--port"},
		hostFlags:    []string{"--host"},
		defaultPort:  30000,
		defaultHost:  "127.0.0.1",
		shiftedPorts: []int{10000},
		shiftedEnv:   "SGLANG_GRPC_PORT",
		httpOff:      []string{"--grpc-mode"},
		worker:       sglangNonZeroRank,
		legFlag:      "--disaggregation-mode",
	},
	{
		// llama.cpp: common/arg.cpp (--host, LLAMA_ARG_HOST, 127.0.0.1;
		// --port, LLAMA_ARG_PORT, 8080); its server images set
		// LLAMA_ARG_HOST=0.0.0.0.
		name:        "llama.cpp",
		programs:    [][]string{{"llama-server"}},
		images:      []string{"ggml-org/llama.cpp:server", "ggerganov/llama.cpp:server"},
		imageEnv:    map[string]string{"LLAMA_ARG_HOST": "0.0.0.0"},
		portFlags:   []string{"--port"},
		hostFlags:   []string{"--host"},
		portEnv:     "LLAMA_ARG_PORT",
		hostEnv:     "LLAMA_ARG_HOST",
		defaultPort: 8080,
		defaultHost: "127.0.0.1",
	},
	{
		// TGI: launcher/src/main.rs (--port/-p, PORT, 3000; --hostname,
		// HOSTNAME, 0.0.0.0; --prometheus-port 9000); its images set
		// PORT=80. The router (router/src/server.rs) binds 0.0.0.0 for a
		// hostname that is not an IP address, such as the pod's name the
		// kubelet puts in HOSTNAME, and its Google Cloud build listens on
		// AIP_HTTP_PORT when set, whatever --port says.
		name:              "TGI",
		programs:          [][]string{{"text-generation-launcher"}},
		images:            []string{"text-generation-inference"},
		imageEnv:          map[string]string{"PORT": "80"},
		portFlags:         []string{"--port", "-p"},
		hostFlags:         []string{"--hostname"},
		portEnv:           "PORT",
		hostEnv:           "HOSTNAME",
		overridingPortEnv: "AIP_HTTP_PORT",
		impliedPorts:      []int{9000},
		defaultPort:       3000,
		defaultHost:       "0.0.0.0",
	},
	{
		// KServe's huggingfaceserver (vLLM behind KServe's model server):
		// kserve/model_server.py (--http_port, 8080); its REST server
		// binds 0.0.0.0.
		name:         "KServe's huggingfaceserver",
		programs:     [][]string{{"huggingfaceserver"}},
		images:       []string{"huggingfaceserver"}, // kserve/huggingfaceserver, and the runtimes' huggingfaceserver:replace
		portFlags:    []string{"--http_port", "--http-port"},
		impliedPorts: []int{8081}, // --grpc_port
		defaultPort:  8080,
	},
}

// routingSidecar is llm-d's routing sidecar (pd-sidecar) in a decode pod:
// it sends a split request's prefill leg to a prefill pod, then the
// decode leg to the engine behind it (--vllm-port). The sidecar stands in
// front of it, where the client's whole request passes, when it serves
// plain HTTP (--secure-proxy=false; its default is TLS).
var routingSidecar = engine{
	name:        "llm-d's routing sidecar",
	images:      []string{"llm-d-routing-sidecar"},
	portFlags:   []string{"--port", "-port"},
	defaultPort: 8000,
	movedName:   "routing",
}

// routers are programs that serve an engine's API in front of engines
// (production-stack's router, llm-d's routing proxy, gateways): never an
// engine, whatever port they listen on.
var routers = []string{"vllm_router", "vllm-router", "llm-d-routing-sidecar", "routing-proxy", "envoy", "gateway"}

// unknownEngine is a program inject does not know, named by the user: it
// is moved only through a --port flag it already has.
var unknownEngine = engine{name: "the engine", portFlags: []string{"--port"}, hostFlags: []string{"--host"}}

// servesHTTP refuses an engine started to serve no HTTP API: there is
// nothing for the sidecar to relay, and moving it would point the sidecar
// at a gRPC port. The flags are switches (argparse's store_true, which
// takes no value).
func (e *engine) servesHTTP(runs []*invocation) error {
	for _, run := range runs {
		for _, w := range run.words[run.args:] {
			if slices.Contains(e.httpOff, w.value) {
				return fmt.Errorf("%s is started with %s and serves gRPC alone, and the sidecar relays HTTP: add nothing, or serve HTTP", e.name, w.value)
			}
		}
	}
	return nil
}

// programAt tells whether words, from i, name one of e's programs, and
// where its arguments begin.
func (e *engine) programAt(words []word, i int) (int, bool) {
	for _, p := range e.programs {
		if i+len(p) > len(words) {
			continue
		}
		if path.Base(words[i].value) != p[0] {
			continue
		}
		ok := true
		for j := 1; j < len(p); j++ {
			ok = ok && words[i+j].value == p[j]
		}
		if ok {
			return i + len(p), true
		}
	}
	return 0, false
}

// runByImage tells whether c runs e by its image's entrypoint.
func (e *engine) runByImage(c *yaml.RNode) bool {
	if len(stringsOf(c, "command")) > 0 {
		return false
	}
	return e.imageIs(scalar(c, "image"))
}

// imageIs tells whether image is one of e's.
func (e *engine) imageIs(image string) bool {
	for _, m := range e.images {
		if strings.Contains(image, m) {
			return true
		}
	}
	return false
}

// isRouter tells a router or gateway, by its command or image.
func isRouter(c *yaml.RNode) bool {
	line := strings.Join(append(stringsOf(c, "command"), stringsOf(c, "args")...), " ")
	image := scalar(c, "image")
	for _, r := range routers {
		if strings.Contains(line, r) || strings.Contains(image, r) {
			return true
		}
	}
	return false
}

// vllmHeadless: `vllm serve --headless` runs a data-parallel node's
// engines with no API server.
func vllmHeadless(run *invocation, _ *podSpec) (bool, error) {
	return run.has("--headless"), nil
}

// sglangNonZeroRank: in a multi-node SGLang deployment only node rank 0
// serves HTTP. A rank written as LeaderWorkerSet's $(LWS_WORKER_INDEX) is
// 0 in the leader's template and above 0 in the workers' (LWS's
// documented env); any other rank inject cannot read is refused, as one
// template then runs both kinds of node.
func sglangNonZeroRank(run *invocation, in *podSpec) (bool, error) {
	v, ok := run.flag([]string{"--node-rank"})
	if !ok {
		return false, nil
	}
	if v.known {
		return strings.TrimSpace(v.value) != "0", nil
	}
	if strings.Contains(v.raw, "LWS_WORKER_INDEX") && in.lwsRole != "" {
		return in.lwsRole == "worker", nil
	}
	return false, errRankUnknown(v.raw)
}

// errRankUnknown refuses a node rank inject cannot read.
func errRankUnknown(raw string) error {
	return fmt.Errorf("the node rank %s is set when the pod starts: one template then runs both the rank-0 node, which serves the API, and the others, which do not, and a sidecar in front of those would never be ready; give the rank-0 node a template of its own and inject that", raw)
}
