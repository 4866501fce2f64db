package inject

import (
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

// FuzzShellLine injects a pod whose engine starts on an arbitrary shell
// line: inject never panics, writes nothing when it refuses, and what it
// writes is a Pod whose injection again changes nothing.
func FuzzShellLine(f *testing.F) {
	for _, seed := range []string{
		"vllm serve m 2>&1 | tee /tmp/log",
		"vllm serve m # the model",
		"ray start --head --port=6379 && vllm serve m --port 8000",
		"vllm serve m \\\n  --tp 2\n",
		`if [ -n "$X" ]; then vllm serve a; else vllm serve b; fi`,
		"LLAMA_ARG_PORT=9000 exec llama-server --host 0.0.0.0",
		"exec vllm serve m --port ${PORT:-9000} \"$@\"",
		"cat <<EOF\nvllm serve x\nEOF\nvllm serve m",
		"vllm serve m --served-model-name 'a;b' &\nwait",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, line string) {
		in := "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n    - name: e\n      command: [sh, -c, " + strconv.Quote(line) + ", sh, --tp, \"2\"]\n"
		var out strings.Builder
		if err := Inject(strings.NewReader(in), &out, Options{}); err != nil {
			if out.Len() > 0 {
				t.Fatalf("refused (%v) and wrote:\n%s", err, out.String())
			}
			return
		}
		var p corev1.Pod
		if err := sigsyaml.UnmarshalStrict([]byte(out.String()), &p); err != nil {
			t.Fatalf("not a Pod: %v\n%s", err, out.String())
		}
		var again strings.Builder
		if err := Inject(strings.NewReader(out.String()), &again, Options{}); err != nil || again.String() != out.String() {
			t.Fatalf("injecting twice is not injecting once (%v):\n%s\n%s", err, out.String(), again.String())
		}
	})
}

// FuzzManifest injects arbitrary YAML: inject never panics, writes nothing
// when it refuses, and allocates within a bound of the input's size
// whatever its aliases, anchors and nesting (an alias that escaped the
// bound would cost gigabytes).
func FuzzManifest(f *testing.F) {
	for _, seed := range []string{
		nestedAnchors(9, 9),
		nestedAnchors(3, 12),
		mergeChain(4, 10),
		"apiVersion: v1\nkind: Pod\nmetadata:\n  name: loop\n  annotations:\n    a: &a [x, *a]\n" + engineTail,
		"apiVersion: v1\nkind: Pod\nmetadata: &m\n  name: p\n  labels: {<<: *m}\n" + engineTail,
		"apiVersion: v1\nkind: List\nitems:\n- &p {apiVersion: v1, kind: Pod, metadata: {name: a}, spec: {containers: [{name: e, args: [vllm, serve, m]}]}}\n- *p\n",
		"a: &a [*b]\nb: &b [*a]\n",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in string) {
		var out strings.Builder
		var err error
		n := allocated(func() { err = Inject(strings.NewReader(in), &out, Options{}) })
		if limit := uint64(256<<20 + 1000*len(in)); n > limit {
			t.Fatalf("allocated %d MiB for %d bytes of input (bound %d MiB)", n>>20, len(in), limit>>20)
		}
		if err != nil && out.Len() > 0 {
			t.Fatalf("refused (%v) and wrote:\n%s", err, out.String())
		}
	})
}
