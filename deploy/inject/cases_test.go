package inject

import (
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/timing-sidecar/timing-sidecar/telemetry/spool"
)

// podWith is a Pod whose spec is spec, indented under it.
func podWith(spec string) string {
	return "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n" + indent(spec, "  ")
}

func indent(s, pad string) string {
	return pad + strings.ReplaceAll(strings.TrimSuffix(s, "\n"), "\n", "\n"+pad) + "\n"
}

// shellPod runs line with sh -c in a container that declares ports.
func shellPod(line string, ports ...int) string {
	spec := "containers:\n  - name: e\n    command: [sh, -c]\n    args:\n      - " + strconv.Quote(line) + "\n"
	if len(ports) > 0 {
		spec += "    ports:\n"
		for _, p := range ports {
			spec += "      - containerPort: " + strconv.Itoa(p) + "\n"
		}
	}
	return podWith(spec)
}

// injectPodOK injects in and decodes the Pod that comes out, checked as
// every output is.
func injectPodOK(t *testing.T, in string, opts Options) (corev1.Pod, string) {
	t.Helper()
	out, err := injectString(t, in, opts)
	if err != nil {
		t.Fatalf("%v\n%s", err, in)
	}
	var p corev1.Pod
	strict(t, out, &p)
	checkOutput(t, in, out, opts)
	return p, out
}

func container(spec corev1.PodSpec, name string) *corev1.Container {
	for _, list := range [][]corev1.Container{spec.Containers, spec.InitContainers} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	return nil
}

// refused checks that in is refused with an error saying want, and
// nothing written.
func refused(t *testing.T, name, in string, opts Options, want string) {
	t.Helper()
	out, err := injectString(t, in, opts)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: error %v, want one saying %q", name, err, want)
	}
	if out != "" {
		t.Errorf("%s: wrote output with the error", name)
	}
}

// TestShellLines: the engine's port in a shell line is a word of the
// engine's command, whatever else the line holds; the line is otherwise
// unchanged.
func TestShellLines(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
		ports          []int
		listen         string
	}{
		{"a redirection after the engine", "vllm serve m 2>&1 | tee /tmp/log", "vllm serve m --port 18000 2>&1 | tee /tmp/log", nil, ":8000"},
		{"a comment after the engine", "vllm serve m # the model", "vllm serve m --port 18000 # the model", nil, ":8000"},
		{"a comment naming --port", "vllm serve m --port 8000 # not --port 1", "vllm serve m --port 18000 # not --port 1", nil, ":8000"},
		{"a quoted separator", "vllm serve m --served-model-name 'a;b' && echo done", "vllm serve m --served-model-name 'a;b' --port 18000 && echo done", nil, ":8000"},
		{"a double-quoted separator", `vllm serve m --chat-template "x|y"`, `vllm serve m --chat-template "x|y" --port 18000`, nil, ":8000"},
		{"ray then the engine, both ports declared", "ray start --head --port=6379 && vllm serve m", "ray start --head --port=6379 && vllm serve m --port 18000", []int{6379, 8000}, ":8000"},
		{"ray's port on the line", "ray start --head --port 6379; vllm serve m --port 8000 --tp 8; echo --port 1", "ray start --head --port 6379; vllm serve m --port 18000 --tp 8; echo --port 1", nil, ":8000"},
		{"--port=", "ray start --port=6379 && vllm serve m --port=8000", "ray start --port=6379 && vllm serve m --port=18000", nil, ":8000"},
		{"exec", "ray start --port 6379 && exec vllm serve m", "ray start --port 6379 && exec vllm serve m --port 18000", nil, ":8000"},
		{"continued lines", "vllm serve m \\\n  --port 8000 \\\n  --tp 2\n", "vllm serve m \\\n  --port 18000 \\\n  --tp 2\n", nil, ":8000"},
		{"continued lines, port added", "vllm serve m \\\n  --tp 2\n", "vllm serve m \\\n  --tp 2 --port 18000\n", nil, ":8000"},
		{"a quoted port", `vllm serve m --port "9000"`, `vllm serve m --port 19000`, nil, ":9000"},
		{"a default in the line", "vllm serve m --port ${PORT:-9000}", "vllm serve m --port 19000", nil, ":9000"},
		{"in a conditional, on both branches", `if [ -n "$X" ]; then vllm serve a; else vllm serve b; fi`, `if [ -n "$X" ]; then vllm serve a --port 18000; else vllm serve b --port 18000; fi`, nil, ":8000"},
		{"backgrounded and waited", "vllm serve m --port 8000 &\nwait", "vllm serve m --port 18000 &\nwait", nil, ":8000"},
		{"SGLang in a pipeline", "python3 -m sglang.launch_server --model-path m --host 0.0.0.0 | tee log", "python3 -m sglang.launch_server --model-path m --host 0.0.0.0 --port 40000 | tee log", nil, ":30000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := injectPodOK(t, shellPod(tc.in, tc.ports...), Options{})
			if got := p.Spec.Containers[0].Args[0]; got != tc.want {
				t.Errorf("%q became\n%q, want\n%q", tc.in, got, tc.want)
			}
			if got := sidecarEnv(p.Spec)["TIMING_SIDECAR_LISTEN"]; got != tc.listen {
				t.Errorf("the sidecar listens on %q, want %q", got, tc.listen)
			}
		})
	}
	for _, tc := range []struct{ name, in, want string }{
		{"does not parse", "vllm serve m 'unclosed", "does not parse"},
		{"the engine inside another shell's quotes", `ray start && bash -c "vllm serve m"`, "inside another shell's quotes"},
		{"started through eval", `eval "vllm serve m"`, "inside another shell's quotes"},
		{"a port the line sets itself", "PORT=9000; vllm serve m --port $PORT", "cannot read the engine's port from --port $PORT"},
		{"starts that disagree", "vllm serve a --port 8000 || vllm serve b --port 9000", "disagree"},
	} {
		refused(t, tc.name, shellPod(tc.in), Options{}, tc.want)
	}
}

// TestPortAndAddress: the engine's port and address come from its own
// flags in each form, its env as the kubelet expands it, its image's ENV
// and its default; the sidecar listens where it did, loopback staying
// loopback, and relays to where it moved. What cannot be read is refused
// with the input to set.
func TestPortAndAddress(t *testing.T) {
	type want struct {
		listen, upstream string
		engine           []string // the engine's command and args after
		env              map[string]string
	}
	for _, tc := range []struct {
		name, spec string
		opts       Options
		want       want
	}{
		{"vLLM on loopback", "containers:\n  - name: e\n    command: [vllm, serve, m, --host, 127.0.0.1]\n",
			Options{}, want{"127.0.0.1:8000", "http://127.0.0.1:18000", []string{"vllm", "serve", "m", "--host", "127.0.0.1", "--port", "18000"}, nil}},
		{"vLLM on localhost, --host=", "containers:\n  - name: e\n    command: [vllm, serve, m, --host=localhost, --port=8001]\n",
			Options{}, want{"127.0.0.1:8001", "http://127.0.0.1:18001", []string{"vllm", "serve", "m", "--host=localhost", "--port=18001"}, nil}},
		{"vLLM on IPv6 loopback", "containers:\n  - name: e\n    command: [vllm, serve, m, --host, '::1']\n",
			Options{}, want{"[::1]:8000", "http://[::1]:18000", nil, nil}},
		{"vLLM on every interface", "containers:\n  - name: e\n    command: [vllm, serve, m, --host, 0.0.0.0]\n",
			Options{}, want{":8000", "http://127.0.0.1:18000", nil, nil}},
		{"$(PORT) as the kubelet expands it", "containers:\n  - name: e\n    command: [vllm, serve, m, --port, $(PORT)]\n    env:\n      - {name: PORT, value: \"9000\"}\n",
			Options{}, want{":9000", "http://127.0.0.1:19000", []string{"vllm", "serve", "m", "--port", "19000"}, map[string]string{"PORT": "9000"}}},
		{"$(PORT) in --port=", "containers:\n  - name: e\n    args: [vllm, serve, m, --port=$(PORT)]\n    env:\n      - {name: PORT, value: \"9000\"}\n",
			Options{}, want{":9000", "http://127.0.0.1:19000", []string{"vllm", "serve", "m", "--port=19000"}, nil}},
		{"${PORT} in a shell line", "containers:\n  - name: e\n    command: [bash, -ec, 'vllm serve m --port ${PORT}']\n    env:\n      - {name: PORT, value: \"9000\"}\n",
			Options{}, want{":9000", "http://127.0.0.1:19000", []string{"bash", "-ec", "vllm serve m --port 19000"}, nil}},
		{"$(PORT) in a shell line, the kubelet's", "containers:\n  - name: e\n    command: [sh, -c, 'vllm serve m --port $(PORT)']\n    env:\n      - {name: PORT, value: \"9000\"}\n",
			Options{}, want{":9000", "http://127.0.0.1:19000", []string{"sh", "-c", "vllm serve m --port 19000"}, nil}},
		{"an env value through another", "containers:\n  - name: e\n    command: [vllm, serve, m, --port, $(PORT)]\n    env:\n      - {name: BASE, value: \"9000\"}\n      - {name: PORT, value: $(BASE)}\n",
			Options{}, want{":9000", "http://127.0.0.1:19000", nil, nil}},
		{"llama.cpp's LLAMA_ARG_PORT, in its image", "containers:\n  - name: e\n    image: ghcr.io/ggml-org/llama.cpp:server\n    args: [-m, /models/m.gguf]\n    env:\n      - {name: LLAMA_ARG_PORT, value: \"8081\"}\n",
			Options{}, want{":8081", "http://127.0.0.1:18081", []string{"-m", "/models/m.gguf"}, map[string]string{"LLAMA_ARG_PORT": "18081"}}},
		{"llama.cpp's LLAMA_ARG_HOST on loopback", "containers:\n  - name: e\n    image: ghcr.io/ggml-org/llama.cpp:server\n    env:\n      - {name: LLAMA_ARG_HOST, value: 127.0.0.1}\n",
			Options{}, want{"127.0.0.1:8080", "http://127.0.0.1:18080", []string{"--port", "18080"}, nil}},
		{"TGI's -p", "containers:\n  - name: e\n    image: ghcr.io/huggingface/text-generation-inference:3.3\n    args: [--model-id, m, -p, \"8080\"]\n",
			Options{}, want{":8080", "http://127.0.0.1:18080", []string{"--model-id", "m", "-p", "18080"}, nil}},
		{"TGI's -p8080", "containers:\n  - name: e\n    command: [text-generation-launcher, -p8080]\n",
			Options{}, want{":8080", "http://127.0.0.1:18080", []string{"text-generation-launcher", "-p18080"}, nil}},
		{"TGI's image's PORT", "containers:\n  - name: e\n    image: ghcr.io/huggingface/text-generation-inference:3.3\n    args: [--model-id, m]\n    ports: [{containerPort: 80}]\n",
			Options{}, want{":80", "http://127.0.0.1:10080", []string{"--model-id", "m", "--port", "10080"}, nil}},
		{"TGI's HOSTNAME, the pod's name", "containers:\n  - name: e\n    command: [text-generation-launcher]\n    env:\n      - {name: HOSTNAME, value: my-pod}\n",
			Options{}, want{":3000", "http://127.0.0.1:13000", nil, nil}},
		{"a port from a secret, given with --engine-port", "containers:\n  - name: e\n    command: [vllm, serve, m, --port, $(PORT)]\n    env:\n      - name: PORT\n        valueFrom: {secretKeyRef: {name: s, key: port}}\n",
			Options{EnginePort: 9000}, want{":9000", "http://127.0.0.1:19000", []string{"vllm", "serve", "m", "--port", "19000"}, nil}},
		{"a default the container contradicts, given with --engine-port", "containers:\n  - name: e\n    image: registry.local/tgi:custom\n    command: [text-generation-launcher]\n    ports: [{containerPort: 80}]\n",
			Options{EnginePort: 80}, want{":80", "http://127.0.0.1:10080", []string{"text-generation-launcher", "--port", "10080"}, nil}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, out := injectPodOK(t, podWith(tc.spec), tc.opts)
			env := sidecarEnv(p.Spec)
			if env["TIMING_SIDECAR_LISTEN"] != tc.want.listen || env["TIMING_SIDECAR_UPSTREAM"] != tc.want.upstream {
				t.Errorf("the sidecar listens on %q and relays to %q, want %q and %q:\n%s", env["TIMING_SIDECAR_LISTEN"], env["TIMING_SIDECAR_UPSTREAM"], tc.want.listen, tc.want.upstream, out)
			}
			e := container(p.Spec, "e")
			if got := append(append([]string{}, e.Command...), e.Args...); tc.want.engine != nil && strings.Join(got, " ") != strings.Join(tc.want.engine, " ") {
				t.Errorf("the engine runs %q, want %q", got, tc.want.engine)
			}
			for name, value := range tc.want.env {
				for _, v := range e.Env {
					if v.Name == name && v.Value != value {
						t.Errorf("the engine's %s is %q, want %q", name, v.Value, value)
					}
				}
			}
		})
	}
	for _, tc := range []struct {
		name, spec string
		opts       Options
		want       string
	}{
		{"a port from a secret", "containers:\n  - name: e\n    command: [vllm, serve, m, --port, $(PORT)]\n    env:\n      - name: PORT\n        valueFrom: {secretKeyRef: {name: s, key: port}}\n", Options{}, "--engine-port"},
		{"a port from envFrom", "containers:\n  - name: e\n    command: [sh, -c, 'vllm serve m --port $PORT']\n    envFrom: [{configMapRef: {name: c}}]\n", Options{}, "--engine-port"},
		{"a port that is no number", "containers:\n  - name: e\n    command: [vllm, serve, m, --port, http]\n", Options{}, "is not a port number"},
		{"a default the probes contradict", "containers:\n  - name: e\n    command: [vllm, serve, m]\n    ports: [{containerPort: 8080}]\n    readinessProbe: {httpGet: {path: /health, port: 8080}}\n", Options{}, "give the engine its port with --port"},
		{"--engine-port against the engine's flag", "containers:\n  - name: e\n    command: [vllm, serve, m, --port, \"8000\"]\n", Options{EnginePort: 9000}, "must agree"},
		{"a host of the pod's IP", "containers:\n  - name: e\n    command: [vllm, serve, m, --host, $(POD_IP)]\n    env:\n      - name: POD_IP\n        valueFrom: {fieldRef: {fieldPath: status.podIP}}\n", Options{}, "cannot read the address"},
		{"a host of one address", "containers:\n  - name: e\n    command: [vllm, serve, m, --host, 10.0.0.5]\n", Options{}, "listens on 10.0.0.5 only"},
		{"an unknown engine without --port", "containers:\n  - name: e\n    command: [my-server]\n    ports: [{containerPort: 7000}]\n", Options{EngineContainer: "e"}, "no --port flag"},
	} {
		refused(t, tc.name, podWith(tc.spec), tc.opts, tc.want)
	}
}

// TestPodPorts: every port the sidecar adds is free in the whole pod; the
// admin port moves off a held one or is set; a hostPort follows the
// engine's port to the sidecar; --engine-container picks among
// candidates; the sidecar's ports keep unique names.
func TestPodPorts(t *testing.T) {
	t.Run("an engine on the admin port", func(t *testing.T) {
		p, _ := injectPodOK(t, podWith("containers:\n  - name: e\n    command: [vllm, serve, m, --port, \"9101\"]\n    ports: [{containerPort: 9101}]\n"), Options{})
		env := sidecarEnv(p.Spec)
		if env["TIMING_SIDECAR_LISTEN"] != ":9101" || env["TIMING_SIDECAR_ADMIN_LISTEN"] != ":9102" || adminPortOf(p.Spec) != 9102 {
			t.Errorf("listen %q, admin %q, admin port %d", env["TIMING_SIDECAR_LISTEN"], env["TIMING_SIDECAR_ADMIN_LISTEN"], adminPortOf(p.Spec))
		}
	})
	t.Run("another container on the admin port and the engine's next", func(t *testing.T) {
		p, _ := injectPodOK(t, podWith("containers:\n  - name: e\n    command: [vllm, serve, m]\n  - name: other\n    image: x\n    ports: [{containerPort: 9101}, {containerPort: 18000}]\n"), Options{})
		env := sidecarEnv(p.Spec)
		if env["TIMING_SIDECAR_UPSTREAM"] != "http://127.0.0.1:18001" || adminPortOf(p.Spec) != 9102 {
			t.Errorf("upstream %q, admin port %d", env["TIMING_SIDECAR_UPSTREAM"], adminPortOf(p.Spec))
		}
	})
	t.Run("a port another program is given", func(t *testing.T) {
		p, _ := injectPodOK(t, shellPod("metrics-exporter --listen-port 18000 & vllm serve m"), Options{})
		if got := sidecarEnv(p.Spec)["TIMING_SIDECAR_UPSTREAM"]; got != "http://127.0.0.1:18001" {
			t.Errorf("upstream %q", got)
		}
	})
	// Ports a neighbour may bind without declaring them: the engine's new
	// port goes past each.
	for _, tc := range []struct{ name, neighbour string }{
		{"a --web.listen-address", "    args: [--web.listen-address=:18000]\n"},
		{"a host:port argument", "    args: [serve, 0.0.0.0:18000]\n"},
		{"a PORT in env", "    env: [{name: PORT, value: \"18000\"}]\n"},
		{"a *_PORT in env", "    env: [{name: METRICS_PORT, value: \"18000\"}]\n"},
		{"an address in env", "    env: [{name: LISTEN, value: \"127.0.0.1:18000\"}]\n"},
		{"a --*-port flag", "    args: [--kv-port, \"18000\"]\n"},
		{"a port field in a JSON argument", "    args: [--kv-transfer-config, '{\"kv_connector\":\"NixlConnector\",\"kv_port\":18000}']\n"},
	} {
		t.Run("a neighbour's "+tc.name, func(t *testing.T) {
			p, _ := injectPodOK(t, podWith("containers:\n  - name: e\n    command: [vllm, serve, m]\n  - name: other\n    image: x\n"+tc.neighbour), Options{})
			if got := sidecarEnv(p.Spec)["TIMING_SIDECAR_UPSTREAM"]; got != "http://127.0.0.1:18001" {
				t.Errorf("upstream %q beside a neighbour that may bind 18000", got)
			}
		})
	}
	t.Run("admin-listen on a port only a neighbour's URL names", func(t *testing.T) {
		p, _ := injectPodOK(t, podWith("containers:\n  - name: e\n    command: [vllm, serve, m]\n  - name: other\n    image: x\n    args: [--collector, \"http://collector:9200\"]\n"), Options{Env: []EnvVar{{"TIMING_SIDECAR_ADMIN_LISTEN", ":9200"}}})
		if adminPortOf(p.Spec) != 9200 {
			t.Errorf("admin port %d", adminPortOf(p.Spec))
		}
	})
	t.Run("admin-listen set", func(t *testing.T) {
		p, _ := injectPodOK(t, podWith("containers:\n  - name: e\n    command: [vllm, serve, m]\n"), Options{Env: []EnvVar{{"TIMING_SIDECAR_ADMIN_LISTEN", ":9200"}}})
		if adminPortOf(p.Spec) != 9200 || sidecarEnv(p.Spec)["TIMING_SIDECAR_ADMIN_LISTEN"] != ":9200" {
			t.Errorf("admin port %d", adminPortOf(p.Spec))
		}
	})
	t.Run("a hostPort", func(t *testing.T) {
		p, _ := injectPodOK(t, podWith("containers:\n  - name: e\n    command: [vllm, serve, m]\n    ports: [{name: http, containerPort: 8000, hostPort: 8000}]\n"), Options{})
		e, s := container(p.Spec, "e"), findSidecar(p.Spec)
		if e.Ports[0].HostPort != 0 || s.Ports[0].HostPort != 8000 || s.Ports[0].ContainerPort != 8000 || s.Ports[0].Name != "http" {
			t.Errorf("engine ports %+v, sidecar ports %+v", e.Ports, s.Ports)
		}
	})
	t.Run("--engine-container picks one of two", func(t *testing.T) {
		p, _ := injectPodOK(t, podWith("containers:\n  - name: a\n    command: [vllm, serve, m]\n  - name: b\n    command: [llama-server, --port, \"9000\", --host, 0.0.0.0]\n"), Options{EngineContainer: "b"})
		if got := sidecarEnv(p.Spec)["TIMING_SIDECAR_LISTEN"]; got != ":9000" {
			t.Errorf("listen %q", got)
		}
	})
	t.Run("the port's name taken by another container", func(t *testing.T) {
		p, _ := injectPodOK(t, podWith("containers:\n  - name: e\n    command: [vllm, serve, m]\n  - name: other\n    image: x\n    ports: [{name: http, containerPort: 7000}]\n"), Options{})
		if s := findSidecar(p.Spec); s.Ports[0].Name != "timing-http" {
			t.Errorf("sidecar ports %+v", s.Ports)
		}
	})
	for _, tc := range []struct {
		name, spec string
		opts       Options
		want       string
	}{
		{"another container's port named timing-admin", "containers:\n  - name: e\n    command: [vllm, serve, m]\n  - name: other\n    image: x\n    ports: [{name: timing-admin, containerPort: 9500}]\n", Options{}, `container "other" already has a port named timing-admin`},
		{"admin-listen on a held port", "containers:\n  - name: e\n    command: [vllm, serve, m]\n  - name: other\n    image: x\n    ports: [{containerPort: 9200}]\n", Options{Env: []EnvVar{{"TIMING_SIDECAR_ADMIN_LISTEN", ":9200"}}}, `admin-listen's port 9200 is held by container "other"`},
		{"admin-listen on the engine's port", "containers:\n  - name: e\n    command: [vllm, serve, m]\n", Options{Env: []EnvVar{{"TIMING_SIDECAR_ADMIN_LISTEN", ":8000"}}}, "admin-listen's port 8000 is held by the engine"},
		{"admin-listen on loopback", "containers:\n  - name: e\n    command: [vllm, serve, m]\n", Options{Env: []EnvVar{{"TIMING_SIDECAR_ADMIN_LISTEN", "127.0.0.1:9101"}}}, "on loopback"},
		{"two candidates, none named", "containers:\n  - name: a\n    command: [vllm, serve, m]\n  - name: b\n    command: [llama-server]\n", Options{}, "name one with --engine-container"},
	} {
		refused(t, tc.name, podWith(tc.spec), tc.opts, tc.want)
	}
}

func adminPortOf(spec corev1.PodSpec) int {
	for _, p := range findSidecar(spec).Ports {
		if p.Name == adminPortName {
			return int(p.ContainerPort)
		}
	}
	return 0
}

// TestKnative: KServe's kinds and Knative's Service get a pod Knative
// admits (checkKnativeRules, in checkOutput): one port, on the engine's
// container, where the sidecar listens; no probes, restartPolicy or
// downward API on the sidecar.
func TestKnative(t *testing.T) {
	for _, tc := range []struct{ name, doc string }{
		{"a ServingRuntime with a named h2c port", "apiVersion: serving.kserve.io/v1alpha1\nkind: ServingRuntime\nmetadata:\n  name: r\nspec:\n  containers:\n    - name: kserve-container\n      image: vllm/vllm-openai:v0.11.0\n      args: [--port, \"8080\"]\n      ports: [{name: h2c, containerPort: 8080, protocol: TCP}]\n      readinessProbe: {httpGet: {path: /health, port: h2c}}\n"},
		{"an InferenceService with no port", "apiVersion: serving.kserve.io/v1beta1\nkind: InferenceService\nmetadata:\n  name: i\nspec:\n  predictor:\n    containers:\n      - name: kserve-container\n        image: vllm/vllm-openai:v0.11.0\n        args: [--port, \"8080\"]\n"},
		{"a Knative Service", "apiVersion: serving.knative.dev/v1\nkind: Service\nmetadata:\n  name: k\nspec:\n  template:\n    spec:\n      containers:\n        - name: e\n          command: [vllm, serve, m]\n          ports: [{containerPort: 8000}]\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := injectString(t, tc.doc, Options{})
			if err != nil {
				t.Fatal(err)
			}
			checkOutput(t, tc.doc, out, Options{})
			if !strings.Contains(out, "name: "+Name) {
				t.Errorf("no sidecar:\n%s", out)
			}
		})
	}
}

// TestWorkers: a multi-node engine's workers that serve no API get no
// sidecar (its readiness would wait for an API server that never comes);
// the node that serves the API does; a rank read only when the pod starts
// is refused.
func TestWorkers(t *testing.T) {
	lws := func(leader, worker string) string {
		return "apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\nmetadata:\n  name: l\nspec:\n  leaderWorkerTemplate:\n    leaderTemplate:\n      spec:\n        containers:\n          - name: e\n            command: [sh, -c, " + strconv.Quote(leader) + "]\n    workerTemplate:\n      spec:\n        containers:\n          - name: e\n            command: [sh, -c, " + strconv.Quote(worker) + "]\n"
	}
	for _, tc := range []struct {
		name, in string
		sidecars int
	}{
		{"vLLM data parallel: the API node and a headless one", lws("vllm serve m --data-parallel-size 4", "vllm serve m --data-parallel-size 4 --headless --data-parallel-start-rank 2"), 1},
		{"SGLang by LWS_WORKER_INDEX", lws("python3 -m sglang.launch_server --model-path m --host 0.0.0.0 --nnodes 2 --node-rank $(LWS_WORKER_INDEX)", "python3 -m sglang.launch_server --model-path m --nnodes 2 --node-rank $(LWS_WORKER_INDEX)"), 1},
		{"SGLang by literal ranks", lws("python3 -m sglang.launch_server --model-path m --host 0.0.0.0 --node-rank 0", "python3 -m sglang.launch_server --model-path m --node-rank 1"), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := injectString(t, tc.in, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Count(out, "name: "+Name+"\n"); got != tc.sidecars {
				t.Errorf("%d sidecars, want %d:\n%s", got, tc.sidecars, out)
			}
			if strings.Contains(out, "--headless --data-parallel-start-rank 2 --port") || strings.Contains(out, "--node-rank 1 --port") {
				t.Errorf("a worker's command changed:\n%s", out)
			}
		})
	}
	out, err := injectString(t, podWith("containers:\n  - name: e\n    command: [vllm, serve, m, --headless]\n"), Options{})
	if !errors.Is(err, ErrOnlyWorkers) || out != "" {
		t.Errorf("only a headless worker: %v", err)
	}
	refused(t, "a rank set when the pod starts", "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: s\nspec:\n  template:\n    spec:\n      containers:\n        - name: e\n          command: [sh, -c, 'python3 -m sglang.launch_server --model-path m --node-rank ${HOSTNAME##*-}']\n", Options{}, "is set when the pod starts")
}

// TestJSON: JSON in (kubectl get -o json), JSON out, in the input's key
// order; a List's items are injected.
func TestJSON(t *testing.T) {
	in := `{
    "apiVersion": "v1",
    "kind": "List",
    "items": [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "d"},
            "spec": {
                "selector": {"matchLabels": {"app": "d"}},
                "template": {
                    "metadata": {"labels": {"app": "d"}},
                    "spec": {"containers": [{"name": "e", "command": ["sh", "-c", "vllm serve m && echo done"], "ports": [{"containerPort": 8000}]}]}
                }
            }
        }
    ]
}`
	out, err := injectString(t, in, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Kind  string            `json:"kind"`
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if !strings.HasPrefix(out, "{\n    \"apiVersion\": \"v1\",\n    \"kind\": \"List\"") || !strings.Contains(out, `"vllm serve m --port 18000 && echo done"`) {
		t.Errorf("not the input's JSON, injected:\n%s", out)
	}
	if len(list.Items) != 1 || !strings.Contains(string(list.Items[0]), `"name": "timing-sidecar"`) {
		t.Errorf("the item has no sidecar:\n%s", out)
	}
	checkOutput(t, in, out, Options{})
}

// TestPodStarts: the kubelet starts the sidecar. Its rule is checked on
// every output (runAsNonRootProblem, in checkOutput); here the rule
// itself, and each of the two layers that satisfy it on its own: the
// image's numeric USER, and the template's runAsUser.
func TestPodStarts(t *testing.T) {
	yes, no := true, false
	uid := func(n int64) *int64 { return &n }
	for _, tc := range []struct {
		name      string
		sc        *corev1.SecurityContext
		imageUser string
		starts    bool
	}{
		{"a named user, runAsNonRoot, no runAsUser", &corev1.SecurityContext{RunAsNonRoot: &yes}, "nonroot:nonroot", false},
		{"a numeric user", &corev1.SecurityContext{RunAsNonRoot: &yes}, "65532:65532", true},
		{"root by number", &corev1.SecurityContext{RunAsNonRoot: &yes}, "0", false},
		{"no USER at all", &corev1.SecurityContext{RunAsNonRoot: &yes}, "", false},
		{"runAsUser over a named user", &corev1.SecurityContext{RunAsNonRoot: &yes, RunAsUser: uid(65532)}, "nonroot", true},
		{"runAsUser 0", &corev1.SecurityContext{RunAsNonRoot: &yes, RunAsUser: uid(0)}, "65532", false},
		{"runAsNonRoot off", &corev1.SecurityContext{RunAsNonRoot: &no}, "nonroot", true},
	} {
		got := runAsNonRootProblem(&corev1.Container{Name: "c", SecurityContext: tc.sc}, tc.imageUser)
		if (got == "") != tc.starts {
			t.Errorf("%s: %q, want starts=%v", tc.name, got, tc.starts)
		}
	}
	user := imageUser(t)
	template, err := sidecarContainer(&Options{}, &portPlan{listen: 8000, engine: 18000, admin: AdminPort, declared: true}, &podSpec{})
	if err != nil {
		t.Fatal(err)
	}
	var c corev1.Container
	strict(t, yamlString(template), &c)
	if c.SecurityContext == nil || c.SecurityContext.RunAsUser == nil {
		t.Fatal("the template sets no runAsUser")
	}
	if p := runAsNonRootProblem(&c, user); p != "" {
		t.Error(p)
	}
	c.SecurityContext.RunAsUser = nil
	if p := runAsNonRootProblem(&c, user); p != "" {
		t.Errorf("without the template's runAsUser: %s", p)
	}
	if c.SecurityContext.RunAsGroup == nil || strings.Split(user, ":")[0] != "65532" {
		t.Errorf("the image's USER %q and the template's group %v", user, c.SecurityContext.RunAsGroup)
	}
}

// TestOddInputs: inputs a review found written wrong or refused for the
// wrong reason; each gets a pod that runs, or a refusal that says what to
// set.
func TestOddInputs(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		opts     Options
		check    func(t *testing.T, p corev1.Pod)
	}{
		{"null initContainers", podWith("initContainers: null\ncontainers:\n  - name: e\n    command: [vllm, serve, m]\n"), Options{}, func(t *testing.T, p corev1.Pod) {
			if len(p.Spec.InitContainers) != 1 {
				t.Errorf("init containers %d", len(p.Spec.InitContainers))
			}
		}},
		{"null args", podWith("containers:\n  - name: e\n    image: vllm/vllm-openai:v0.11.0\n    args: null\n"), Options{}, func(t *testing.T, p corev1.Pod) {
			if got := strings.Join(p.Spec.Containers[0].Args, " "); got != "--port 18000" {
				t.Errorf("args %q", got)
			}
		}},
		{"a probe's port named in quotes", podWith("containers:\n  - name: e\n    command: [vllm, serve, m]\n    ports: [{name: http, containerPort: 8000}]\n    readinessProbe: {httpGet: {path: /health, port: \"http\"}}\n"), Options{}, nil},
		{"the engine's variable on its own command", shellPod("LLAMA_ARG_PORT=9000 exec llama-server -m m --host 0.0.0.0"), Options{}, func(t *testing.T, p corev1.Pod) {
			if got := sidecarEnv(p.Spec)["TIMING_SIDECAR_LISTEN"]; got != ":9000" || !strings.HasSuffix(p.Spec.Containers[0].Args[0], "--host 0.0.0.0 --port 19000") {
				t.Errorf("listen %q, line %q", got, p.Spec.Containers[0].Args[0])
			}
		}},
		{"arguments handed on with $@", podWith("containers:\n  - name: e\n    command: [sh, -c, 'exec vllm serve m \"$@\"', sh, --port, \"9000\"]\n"), Options{}, func(t *testing.T, p corev1.Pod) {
			if got := p.Spec.Containers[0].Command; got[5] != "19000" || got[2] != `exec vllm serve m "$@"` {
				t.Errorf("command %q", got)
			}
		}},
		{"a port handed on as $1", podWith("containers:\n  - name: e\n    command: [sh, -c, 'exec vllm serve m --port \"$1\"', sh, \"9000\"]\n"), Options{}, func(t *testing.T, p corev1.Pod) {
			if got := p.Spec.Containers[0].Command[4]; got != "19000" {
				t.Errorf("command %q", p.Spec.Containers[0].Command)
			}
		}},
		{"sh -c --", podWith("containers:\n  - name: e\n    command: [sh, -c, --, 'vllm serve m']\n"), Options{}, func(t *testing.T, p corev1.Pod) {
			if got := p.Spec.Containers[0].Command[3]; got != "vllm serve m --port 18000" {
				t.Errorf("line %q", got)
			}
		}},
		{"a repeated --port: the last counts", podWith("containers:\n  - name: e\n    command: [vllm, serve, m, --port, \"9000\", --port, \"8000\"]\n"), Options{}, func(t *testing.T, p corev1.Pod) {
			if got := strings.Join(p.Spec.Containers[0].Command, " "); got != "vllm serve m --port 18000 --port 18000" || sidecarEnv(p.Spec)["TIMING_SIDECAR_LISTEN"] != ":8000" {
				t.Errorf("command %q", got)
			}
		}},
		{"a helper that names the engine", podWith("containers:\n  - name: e\n    command: [vllm, serve, m]\n  - name: wait\n    image: busybox\n    command: [sh, -c, 'echo \"waiting for vllm serve\"; sleep infinity']\n"), Options{}, nil},
		{"an unknown engine given only args", podWith("containers:\n  - name: e\n    image: my/server\n    args: [--port, \"7000\"]\n"), Options{EngineContainer: "e"}, func(t *testing.T, p corev1.Pod) {
			if got := sidecarEnv(p.Spec)["TIMING_SIDECAR_LISTEN"]; got != ":7000" {
				t.Errorf("listen %q", got)
			}
		}},
		{"hidden arguments, with --engine-port", shellPod("exec vllm serve m $EXTRA_ARGS"), Options{EnginePort: 9000}, func(t *testing.T, p corev1.Pod) {
			if got := p.Spec.Containers[0].Args[0]; got != "exec vllm serve m $EXTRA_ARGS --port 19000" {
				t.Errorf("line %q", got)
			}
		}},
		{"a port below 1024", podWith("containers:\n  - name: e\n    image: ghcr.io/huggingface/text-generation-inference:3.3\n"), Options{}, func(t *testing.T, p corev1.Pod) {
			sc := p.Spec.SecurityContext
			if sc == nil || len(sc.Sysctls) != 1 || sc.Sysctls[0].Name != "net.ipv4.ip_unprivileged_port_start" || sc.Sysctls[0].Value != "0" {
				t.Errorf("pod securityContext %+v", sc)
			}
		}},
		{"http and timing-http both taken", podWith("containers:\n  - name: e\n    command: [vllm, serve, m]\n  - name: o\n    image: x\n    ports: [{name: http, containerPort: 7000}, {name: timing-http, containerPort: 7001}]\n"), Options{}, func(t *testing.T, p corev1.Pod) {
			if name := findSidecar(p.Spec).Ports[0].Name; name != "" {
				t.Errorf("the sidecar's port is named %q", name)
			}
		}},
		{"an anchored container list", "apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\nmetadata:\n  name: l\nspec:\n  leaderWorkerTemplate:\n    leaderTemplate:\n      spec:\n        containers: &c\n          - name: e\n            command: [vllm, serve, m]\n    workerTemplate:\n      spec:\n        containers: *c\n", Options{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := injectString(t, tc.in, tc.opts)
			if err != nil {
				t.Fatalf("%v\n%s", err, tc.in)
			}
			checkOutput(t, tc.in, out, tc.opts)
			if tc.check != nil {
				var p corev1.Pod
				strict(t, out, &p)
				tc.check(t, p)
			}
			again, err := injectString(t, out, tc.opts)
			if err != nil || again != out {
				t.Errorf("injecting twice is not injecting once (%v)", err)
			}
		})
	}
	for _, tc := range []struct {
		name, in string
		opts     Options
		want     string
	}{
		{"the engine's variable exported by the line", shellPod("export LLAMA_ARG_HOST=0.0.0.0 LLAMA_ARG_PORT=9000; exec llama-server -m /m"), Options{}, "LLAMA_ARG_PORT, set by the shell line"},
		{"hidden arguments", shellPod("exec vllm serve m $EXTRA"), Options{}, "its arguments hold $EXTRA"},
		{"hidden arguments with a default", shellPod("exec vllm serve m ${EXTRA:---port 9000}"), Options{}, "its arguments hold ${EXTRA:---port 9000}"},
		{"a command substitution", shellPod("exec vllm serve m $(cat /etc/args)"), Options{}, "its arguments hold $(cat /etc/args)"},
		{"a kubelet variable that ends the quotes", podWith("containers:\n  - name: e\n    command: [sh, -c, \"vllm serve m --served-model-name '$(M)'\"]\n    env: [{name: M, value: \"x' --port '9000\"}]\n"), Options{}, "its arguments hold '$(M)'"},
		{"a whole option from the kubelet", podWith("containers:\n  - name: e\n    command: [vllm, serve, m, $(PORT_ARG)]\n    env: [{name: PORT_ARG, valueFrom: {configMapKeyRef: {name: c, key: k}}}]\n"), Options{}, "its arguments hold $(PORT_ARG)"},
		{"hostNetwork: yes", podWith("hostNetwork: yes\ncontainers:\n  - name: e\n    command: [vllm, serve, m]\n"), Options{}, "hostNetwork"},
		{"an anchored command in two containers", podWith("containers:\n  - name: e\n    command: &cmd [vllm, serve, m]\n  - name: f\n    command: *cmd\n"), Options{}, "two containers could be the engine"},
		{"command as a string", podWith("containers:\n  - name: e\n    image: vllm/vllm-openai\n    command: vllm serve m\n"), Options{EngineContainer: "e"}, "its command is not a list"},
		{"--engine-port out of range", podWith("containers:\n  - name: e\n    command: [vllm, serve, m]\n"), Options{EnginePort: 70000}, "--engine-port 70000 is not a port"},
		{"--engine-container naming nothing", podWith("containers:\n  - name: e\n    command: [vllm, serve, m]\n"), Options{EngineContainer: "nope"}, "no pod has a container of that name"},
		{"two commands with --port, the engine unknown", shellPod("ray start --port 6379 && python server.py --port 8000"), Options{EngineContainer: "e"}, "2 commands in the container's shell line have a --port"},
		{"a port below 1024 under Knative", "apiVersion: serving.knative.dev/v1\nkind: Service\nmetadata:\n  name: k\nspec:\n  template:\n    spec:\n      containers:\n        - name: e\n          command: [vllm, serve, m, --port, \"80\"]\n", Options{}, "below 1024 under Knative"},
		{"every problem of the options at once", podWith("containers:\n  - name: e\n    command: [vllm, serve, m]\n"), Options{EnginePort: -1, Env: []EnvVar{{"TIMING_SIDECAR_LISTEN", ":1"}, {"TIMING_SIDECAR_SHUTDOWN_GRACE", "soon"}}}, "TIMING_SIDECAR_LISTEN is set by inject from the pod (the engine's address, and where the engine moves), not by a setting\nshutdown-grace \"soon\" is not a duration\n--engine-port -1 is not a port"},
	} {
		refused(t, tc.name, tc.in, tc.opts, tc.want)
	}
}

// TestPlacement: in an llm-d decode pod, the sidecar goes in front of a
// plain-HTTP routing sidecar by default, where the client's whole request
// passes and its TTFT is the client's; between it and the engine on
// request, or when the routing sidecar serves TLS (its default), which a
// sidecar in front could not relay.
func TestPlacement(t *testing.T) {
	pod := func(secure string) string {
		return podWith("initContainers:\n  - name: routing-proxy\n    image: ghcr.io/llm-d/llm-d-routing-sidecar:v0.3.0\n    args: [--port=8000, --vllm-port=8200, --connector=nixlv2" + secure + "]\n    ports: [{containerPort: 8000}]\n    restartPolicy: Always\n" +
			"containers:\n  - name: vllm\n    command: [vllm, serve, m, --port, \"8200\"]\n    ports: [{containerPort: 8200}]\n")
	}
	for _, tc := range []struct {
		name, in            string
		opts                Options
		listen, upstream    string
		router, engineWords string
	}{
		{"plain HTTP, by default in front", pod(", --secure-proxy=false"), Options{}, ":8000", "http://127.0.0.1:18000", "--port=18000 --vllm-port=8200 --connector=nixlv2 --secure-proxy=false", "vllm serve m --port 8200"},
		{"plain HTTP, asked beside the engine", pod(", --secure-proxy=false"), Options{Placement: PlacementEngine}, ":8200", "http://127.0.0.1:18200", "--port=8000 --vllm-port=8200 --connector=nixlv2 --secure-proxy=false", "vllm serve m --port 18200"},
		{"TLS, beside the engine", pod(""), Options{}, ":8200", "http://127.0.0.1:18200", "--port=8000 --vllm-port=8200 --connector=nixlv2", "vllm serve m --port 18200"},
		// Go's flag package takes a boolean's value only after "=".
		{"--secure-proxy false as two words is TLS", pod(", --secure-proxy, \"false\""), Options{}, ":8200", "http://127.0.0.1:18200", "--port=8000 --vllm-port=8200 --connector=nixlv2 --secure-proxy false", "vllm serve m --port 18200"},
		{"--secure-proxy=0 is plain HTTP", pod(", --secure-proxy=0"), Options{}, ":8000", "http://127.0.0.1:18000", "--port=18000 --vllm-port=8200 --connector=nixlv2 --secure-proxy=0", "vllm serve m --port 8200"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := injectPodOK(t, tc.in, tc.opts)
			env := sidecarEnv(p.Spec)
			router, engine := container(p.Spec, "routing-proxy"), container(p.Spec, "vllm")
			if env["TIMING_SIDECAR_LISTEN"] != tc.listen || env["TIMING_SIDECAR_UPSTREAM"] != tc.upstream ||
				strings.Join(router.Args, " ") != tc.router || strings.Join(engine.Command, " ") != tc.engineWords {
				t.Errorf("listen %q upstream %q; router %q; engine %q", env["TIMING_SIDECAR_LISTEN"], env["TIMING_SIDECAR_UPSTREAM"], router.Args, engine.Command)
			}
		})
	}
	refused(t, "an unknown placement", pod(""), Options{Placement: "middle"}, `placement "middle"`)
}

// TestSGLangLegs: an SGLang server of a disaggregated deployment serves
// one leg of every request its router splits; the sidecar is told which.
func TestSGLangLegs(t *testing.T) {
	for mode, want := range map[string]string{"prefill": "prefill", "decode": "decode", "null": ""} {
		p, _ := injectPodOK(t, podWith("containers:\n  - name: e\n    command: [python3, -m, sglang.launch_server, --model-path, m, --host, 0.0.0.0, --disaggregation-mode, "+mode+"]\n"), Options{})
		if got := sidecarEnv(p.Spec)["TIMING_SIDECAR_DISAGGREGATION_LEG"]; got != want {
			t.Errorf("--disaggregation-mode %s: the sidecar's leg %q, want %q", mode, got, want)
		}
	}
}

// TestOneSpoolPerSidecar: a spool directory is one process's (the spool
// locks it), and inject gives each pod one sidecar and its own emptyDir:
// a pod of two engines gets one sidecar, for the engine named, and
// naming the other on the output changes nothing.
func TestOneSpoolPerSidecar(t *testing.T) {
	two := podWith("containers:\n  - name: a\n    command: [vllm, serve, m]\n  - name: b\n    command: [vllm, serve, n, --port, \"8100\"]\n")
	refused(t, "two engines, none named", two, Options{}, "two containers could be the engine")
	out, err := injectString(t, two, Options{EngineContainer: "a"})
	if err != nil {
		t.Fatal(err)
	}
	again, err := injectString(t, out, Options{EngineContainer: "b"})
	if err != nil || again != out {
		t.Fatalf("naming the other engine on the output changed it (%v):\n%s", err, again)
	}
	if n := strings.Count(out, "name: "+Name+"\n"); n != 1 {
		t.Errorf("%d sidecars in one pod", n)
	}
	if n := strings.Count(out, "mountPath: "+spoolPath); n != 1 {
		t.Errorf("%d spool mounts in one pod", n)
	}
}

// TestSGLangGRPC: an SGLang that serves gRPC alone is refused; the gRPC
// server SGLang starts beside its HTTP one, at its port + 10000 or at
// SGLANG_GRPC_PORT, never lands on a port something else holds.
func TestSGLangGRPC(t *testing.T) {
	const sglang = "containers:\n  - name: e\n    command: [python3, -m, sglang.launch_server, --model-path, m, --host, 0.0.0.0"
	refused(t, "--grpc-mode", podWith(sglang+", --grpc-mode]\n"), Options{}, "SGLang is started with --grpc-mode and serves gRPC alone")
	refused(t, "--grpc-mode in a shell line", shellPod("exec python3 -m sglang.launch_server --model-path m --grpc-mode --host 0.0.0.0"), Options{}, "serves gRPC alone")
	for _, tc := range []struct{ name, pod, upstream string }{
		{"its port + 10000 held at the usual move", sglang + "]\n  - name: other\n    image: x\n    ports: [{containerPort: 50000}]\n", "http://127.0.0.1:40001"},
		{"SGLANG_GRPC_PORT on the usual move", sglang + "]\n    env: [{name: SGLANG_GRPC_PORT, value: \"40000\"}]\n", "http://127.0.0.1:40001"},
		{"SGLANG_GRPC_PORT elsewhere frees its port + 10000", sglang + "]\n    env: [{name: SGLANG_GRPC_PORT, value: \"31000\"}]\n  - name: other\n    image: x\n    ports: [{containerPort: 50000}]\n", "http://127.0.0.1:40000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := injectPodOK(t, podWith(tc.pod), Options{})
			if got := sidecarEnv(p.Spec)["TIMING_SIDECAR_UPSTREAM"]; got != tc.upstream {
				t.Errorf("upstream %q, want %q", got, tc.upstream)
			}
		})
	}
}

// TestSpoolVolume: each pod gets the usage spool's emptyDir, its
// sizeLimit above the bound the sidecar gets (spoolProblems, in
// checkOutput, holds every output to the margin); a volume of that name
// the pod has is kept, unless the spool cannot live on it.
func TestSpoolVolume(t *testing.T) {
	engine := "containers:\n  - name: e\n    command: [vllm, serve, m]\n"
	spoolOf := func(spec corev1.PodSpec) corev1.Volume {
		for _, v := range spec.Volumes {
			if v.Name == spoolVolume {
				return v
			}
		}
		t.Fatalf("no volume %s in %+v", spoolVolume, spec.Volumes)
		return corev1.Volume{}
	}
	for _, tc := range []struct {
		name, maxSize, want string
		bound               int64
	}{
		{"the default bound", "", "320Mi", spool.DefaultMaxSize},
		{"a bound of 1 GiB", "1073741824", "1280Mi", 1 << 30},
		{"a bound of 100 MiB: at least 64Mi more", "104857600", "164Mi", 100 << 20},
		{"a bound in hexadecimal, as the flag reads it", "0x4000000", "128Mi", 64 << 20},
		{"a bound of whole MiB and a byte", "268435457", "322Mi", 256<<20 + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := Options{}
			if tc.maxSize != "" {
				opts.Env = []EnvVar{{"TIMING_SIDECAR_USAGE_SPOOL_MAX_SIZE", tc.maxSize}}
			}
			p, _ := injectPodOK(t, podWith(engine), opts)
			v := spoolOf(p.Spec)
			if v.EmptyDir == nil || v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.String() != tc.want || v.EmptyDir.SizeLimit.Value() <= tc.bound {
				t.Errorf("volume %+v, want an emptyDir of %s, above %d bytes", v, tc.want, tc.bound)
			}
		})
	}
	for _, tc := range []struct{ name, volume string }{
		{"a PVC", "persistentVolumeClaim: {claimName: records}"},
		{"a larger emptyDir", "emptyDir: {sizeLimit: 2Gi}"},
		{"an emptyDir without a limit", "emptyDir: {}"},
	} {
		t.Run("the pod's own: "+tc.name, func(t *testing.T) {
			p, _ := injectPodOK(t, podWith(engine+"volumes:\n  - name: "+spoolVolume+"\n    "+tc.volume+"\n"), Options{})
			if got := spoolOf(p.Spec); len(p.Spec.Volumes) != 1 || got.EmptyDir != nil && got.EmptyDir.SizeLimit != nil && got.EmptyDir.SizeLimit.String() != "2Gi" {
				t.Errorf("volumes %+v", p.Spec.Volumes)
			}
		})
	}
	for _, tc := range []struct{ name, in, want string }{
		{"a Secret", podWith(engine + "volumes:\n  - name: " + spoolVolume + "\n    secret: {secretName: s}\n"), "is a secret volume, which the kubelet mounts read-only"},
		{"in memory", podWith(engine + "volumes:\n  - name: " + spoolVolume + "\n    emptyDir: {medium: Memory}\n"), "counted against the sidecar's memory limit"},
		{"too small", podWith(engine + "volumes:\n  - name: " + spoolVolume + "\n    emptyDir: {sizeLimit: 300Mi}\n"), "has sizeLimit 300Mi, and the kubelet evicts the pod past it: the usage spool needs 320Mi"},
		{"a hostPath under Knative", "apiVersion: serving.knative.dev/v1\nkind: Service\nmetadata:\n  name: k\nspec:\n  template:\n    spec:\n      containers:\n        - name: e\n          command: [vllm, serve, m]\n      volumes:\n        - name: " + spoolVolume + "\n          hostPath: {path: /var/spool}\n", "the ones Knative mounts writable"},
	} {
		refused(t, "the pod's own spool volume: "+tc.name, tc.in, Options{}, tc.want)
	}
	for _, tc := range []struct{ name, dir string }{{"a subdirectory", spoolPath + "/records"}, {"off", ""}} {
		p, _ := injectPodOK(t, podWith(engine), Options{Env: []EnvVar{{"TIMING_SIDECAR_USAGE_SPOOL_DIR", tc.dir}}})
		if got, ok := sidecarEnv(p.Spec)["TIMING_SIDECAR_USAGE_SPOOL_DIR"]; !ok || got != tc.dir {
			t.Errorf("usage-spool-dir %s: the sidecar's is %q", tc.name, got)
		}
	}
	refused(t, "every problem of the spool's settings at once", podWith(engine), Options{Env: []EnvVar{
		{"TIMING_SIDECAR_USAGE_SPOOL_DIR", "/tmp/spool"}, {"TIMING_SIDECAR_USAGE_SPOOL_MAX_SIZE", "256Mi"}, {"TIMING_SIDECAR_SHUTDOWN_GRACE", "soon"}}},
		`usage-spool-dir "/tmp/spool" is not under /var/spool/timing-sidecar, where the volume timing-sidecar-spool is mounted: the sidecar's root filesystem is read-only (a volume of that name in the pod chooses what holds the spool)
shutdown-grace "soon" is not a duration
usage-spool-max-size "256Mi" is not a positive number of bytes`)
	for _, bad := range []string{"0", "-1", "1e9", ""} {
		refused(t, "usage-spool-max-size "+bad, podWith(engine), Options{Env: []EnvVar{{"TIMING_SIDECAR_USAGE_SPOOL_MAX_SIZE", bad}}}, "is not a positive number of bytes")
	}
}

// TestVolumeRules: the API server's and Knative's rules for volumes, as
// checkOutput holds every output to them, each catching what it forbids.
func TestVolumeRules(t *testing.T) {
	mount := func(name, at string) corev1.Container {
		return corev1.Container{Name: "c", VolumeMounts: []corev1.VolumeMount{{Name: name, MountPath: at}}}
	}
	emptyDir := func(name string) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
	}
	secret := corev1.Volume{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "s"}}}
	disk := corev1.Volume{Name: "d", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: "HugePages"}}}
	negative := resource.MustParse("-1Mi")
	shrunk := corev1.Volume{Name: "n", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &negative}}}
	pvc := corev1.Volume{Name: "p", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "p"}}}
	for _, tc := range []struct {
		name    string
		spec    corev1.PodSpec
		knative bool
		want    string
	}{
		{"a mount of no volume", corev1.PodSpec{Containers: []corev1.Container{mount("v", "/v")}}, false, "no volume of the pod"},
		{"two volumes of one name", corev1.PodSpec{Volumes: []corev1.Volume{emptyDir("v"), emptyDir("v")}, Containers: []corev1.Container{mount("v", "/v")}}, false, `two volumes named "v"`},
		{"a name that is no DNS label", corev1.PodSpec{Volumes: []corev1.Volume{emptyDir("V_1")}, Containers: []corev1.Container{mount("V_1", "/v")}}, false, `volume name "V_1"`},
		{"one path mounted twice", corev1.PodSpec{Volumes: []corev1.Volume{emptyDir("a"), emptyDir("b")}, Containers: []corev1.Container{{Name: "c", VolumeMounts: []corev1.VolumeMount{{Name: "a", MountPath: "/v"}, {Name: "b", MountPath: "/v"}}}}}, false, "mounts twice at /v"},
		{"a volume not mounted", corev1.PodSpec{Volumes: []corev1.Volume{emptyDir("v")}, Containers: []corev1.Container{{Name: "c"}}}, true, `volume with name "v" not mounted`},
		{"a relative mountPath", corev1.PodSpec{Volumes: []corev1.Volume{emptyDir("v")}, Containers: []corev1.Container{mount("v", "v")}}, true, "is not absolute"},
		{"a reserved mountPath", corev1.PodSpec{Volumes: []corev1.Volume{emptyDir("v")}, Containers: []corev1.Container{mount("v", "/dev/")}}, true, `"/dev" is a reserved path`},
		{"a medium other than Memory", corev1.PodSpec{Volumes: []corev1.Volume{disk}, Containers: []corev1.Container{mount("d", "/d")}}, true, `medium "HugePages"`},
		{"a negative sizeLimit", corev1.PodSpec{Volumes: []corev1.Volume{shrunk}, Containers: []corev1.Container{mount("n", "/n")}}, true, "sizeLimit -1Mi"},
		{"a Secret mounted writable", corev1.PodSpec{Volumes: []corev1.Volume{secret}, Containers: []corev1.Container{mount("s", "/s")}}, true, "should be readOnly"},
		{"a PVC, off by default", corev1.PodSpec{Volumes: []corev1.Volume{pvc}, Containers: []corev1.Container{mount("p", "/p")}}, true, "a kind its features leave off"},
	} {
		problems := podProblems(tc.spec, tc.knative)
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) }) {
			t.Errorf("%s: %q, want one saying %q", tc.name, problems, tc.want)
		}
	}
	ok := corev1.PodSpec{Volumes: []corev1.Volume{emptyDir("v"), secret}, Containers: []corev1.Container{{Name: "c", VolumeMounts: []corev1.VolumeMount{{Name: "v", MountPath: "/v"}, {Name: "s", MountPath: "/s", ReadOnly: true}}}}}
	if p := podProblems(ok, true); len(p) > 0 {
		t.Errorf("a pod Knative admits: %q", p)
	}
}
