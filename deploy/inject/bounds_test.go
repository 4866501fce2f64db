package inject

import (
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
)

// engineTail is an engine's pod spec, to follow a document's metadata.
const engineTail = "spec:\n  containers:\n  - name: vllm\n    image: vllm/vllm-openai\n    args: [vllm, serve, m]\n"

// nestedAnchors is a Pod whose annotations nest anchors depth deep, each
// alias list repeating the one before width times.
func nestedAnchors(width, depth int) string {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: Pod\nmetadata:\n  name: bomb\n  annotations:\n")
	fmt.Fprintf(&b, "    a0: &a0 [%s]\n", strings.TrimSuffix(strings.Repeat("lol,", width), ","))
	for d := 1; d < depth; d++ {
		fmt.Fprintf(&b, "    a%d: &a%d [%s]\n", d, d, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*a%d,", d-1), width), ","))
	}
	b.WriteString(engineTail)
	return b.String()
}

// mergeChain is a Pod whose labels merge maps that merge maps, depth deep.
func mergeChain(width, depth int) string {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: Pod\nmetadata:\n  name: merges\n  annotations:\n")
	b.WriteString("    m0: &m0 {")
	for i := range width {
		fmt.Fprintf(&b, "k%d: v, ", i)
	}
	b.WriteString("z: v}\n")
	for d := 1; d < depth; d++ {
		fmt.Fprintf(&b, "    m%d: &m%d {", d, d)
		for i := range width {
			fmt.Fprintf(&b, "x%d: *m%d, ", i, d-1)
		}
		b.WriteString("<<: *m" + fmt.Sprint(d-1) + "}\n")
	}
	b.WriteString(engineTail)
	return b.String()
}

// allocated is the bytes allocated while f runs.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// memoryBound is the most inject may allocate on a refusal of any input
// these tests give it.
const memoryBound = 100 << 20

// TestAliasBombsAreRefused: aliases that would expand past the bound, at
// any nesting, or never end, are refused with the document named, having
// allocated a bounded amount, and nothing is written.
func TestAliasBombsAreRefused(t *testing.T) {
	list := "apiVersion: v1\nkind: List\nitems:\n- " + strings.ReplaceAll(strings.TrimSuffix(nestedAnchors(9, 9), "\n"), "\n", "\n  ") + "\n"
	for _, tt := range []struct {
		name, in, want string
	}{
		{"nine deep, nine wide (the 600-byte manifest)", nestedAnchors(9, 9), `document 1 (Pod "bomb"): its aliases expand it`},
		{"two wide, sixty deep", nestedAnchors(2, 60), `document 1 (Pod "bomb"): its aliases expand it`},
		{"one anchor of 60,000 aliased twice", nestedAnchors(60_000, 2), `document 1 (Pod "bomb"): its aliases expand it`},
		{"merge keys", mergeChain(8, 12), `document 1 (Pod "merges"): its aliases expand it`},
		{"in a List", list, `document 1 (Pod "bomb"): its aliases expand it`},
		{"after a good document", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n---\n" + nestedAnchors(9, 9), `document 2 (Pod "bomb")`},
		{"an anchor holding its own alias", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: loop\n  annotations:\n    a: &a [x, *a]\n" + engineTail, `document 1 (Pod "loop"): an anchor contains an alias to itself (&a)`},
		{"a map holding its own alias", "apiVersion: v1\nkind: Pod\nmetadata: &m\n  name: self\n  labels: *m\n" + engineTail, `an anchor contains an alias to itself (&m)`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out strings.Builder
			var err error
			if n := allocated(func() { err = Inject(strings.NewReader(tt.in), &out, Options{}) }); n > memoryBound {
				t.Errorf("allocated %d MiB to refuse %d bytes", n>>20, len(tt.in))
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
			if out.Len() > 0 {
				t.Errorf("refused and wrote:\n%s", out.String())
			}
		})
	}
}

// TestAliasesWithinTheBoundAreExpanded: the anchors manifests use (an env
// list shared by containers, a merge of common labels, a large anchor
// aliased a few times) are injected, each alias its own copy.
func TestAliasesWithinTheBoundAreExpanded(t *testing.T) {
	var big strings.Builder
	for i := range 2_000 {
		fmt.Fprintf(&big, "      - {name: V%d, value: \"%d\"}\n", i, i)
	}
	for _, tt := range []struct{ name, in, want string }{
		{"a shared env list", `apiVersion: v1
kind: Pod
metadata:
  name: shared
  labels: &labels {app: vllm}
  annotations:
    <<: *labels
    note: x
spec:
  containers:
  - name: vllm
    image: vllm/vllm-openai
    args: [vllm, serve, m]
    env: &env
    - {name: HF_HOME, value: /cache}
  - name: helper
    image: busybox
    env: *env
`, "app: vllm"},
		{"an anchor of 2,000 entries aliased four times", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: big\nspec:\n  containers:\n  - name: vllm\n    image: vllm/vllm-openai\n    args: [vllm, serve, m]\n    env: &env\n" + big.String() +
			"  - {name: a, image: busybox, env: *env}\n  - {name: b, image: busybox, env: *env}\n  - {name: c, image: busybox, env: *env}\n  - {name: d, image: busybox, env: *env}\n", "V1999"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := injectString(t, tt.in, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(got, "*") || strings.Contains(got, "&") || !strings.Contains(got, tt.want) || !strings.Contains(got, "name: "+Name) {
				t.Errorf("not injected with its aliases expanded:\n%s", got)
			}
		})
	}
}

// TestInputsAreBounded: the input's size and document count, a shell line
// and an env value built by the kubelet's expansion each have a bound, and
// past it inject refuses (or reads the value as unknown) at once.
func TestInputsAreBounded(t *testing.T) {
	doubling := func(n int) string {
		var b strings.Builder
		b.WriteString("apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - name: vllm\n    image: vllm/vllm-openai\n    env:\n    - {name: E0, value: xxxxxxxxxxxxxxxx}\n")
		for i := 1; i < n; i++ {
			fmt.Fprintf(&b, "    - {name: E%d, value: \"$(E%d)$(E%d)\"}\n", i, i-1, i-1)
		}
		fmt.Fprintf(&b, "    args: [vllm, serve, m, --port, \"$(E%d)\"]\n", n-1)
		return b.String()
	}
	for _, tt := range []struct {
		name string
		in   io.Reader
		want string
	}{
		{"over the size", io.MultiReader(strings.NewReader(nestedAnchors(2, 2)), strings.NewReader("# "+strings.Repeat("x", maxInput))), "over 16 MiB"},
		{"over the documents", strings.NewReader(strings.Repeat("a: 1\n---\n", maxDocuments+2)), "documents"},
		{"a shell line longer than the kernel takes", strings.NewReader("apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - name: vllm\n    command: [sh, -c, \"vllm serve m # " + strings.Repeat("x", maxArg) + "\"]\n"), "the shell line is"},
		{"env values that double sixty times", strings.NewReader(doubling(60)), "--port"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out strings.Builder
			var err error
			if n := allocated(func() { err = Inject(tt.in, &out, Options{}) }); n > 2*maxInput+memoryBound {
				t.Errorf("allocated %d MiB", n>>20)
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

// TestExpansionIsBoundedPerContainer: many values that each repeat one
// large value stay within what the kernel would pass a program in all;
// past it they read as unknown, and inject neither grows without bound
// nor reads a port from them.
func TestExpansionIsBoundedPerContainer(t *testing.T) {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - name: vllm\n    image: vllm/vllm-openai\n    env:\n    - {name: D0, value: xxxxxxxxxxxxxxxx}\n")
	for i := 1; i <= 12; i++ { // D12 is 64 KiB
		fmt.Fprintf(&b, "    - {name: D%d, value: \"$(D%d)$(D%d)\"}\n", i, i-1, i-1)
	}
	for i := range 20_000 { // 20,000 copies of 64 KiB: 1.3 GB if expanded
		fmt.Fprintf(&b, "    - {name: R%d, value: $(D12)}\n", i)
	}
	b.WriteString("    - {name: P, value: \"8000\"}\n    command: [sh, -c, \"vllm serve m --port $(P) ${R1}${R2}${R3}\"]\n")
	var out strings.Builder
	var err error
	// The fuzz target's bound: kyaml's own cost is a few hundred bytes
	// per byte of input.
	if n := allocated(func() { err = Inject(strings.NewReader(b.String()), &out, Options{}) }); n > 256<<20+1000*uint64(b.Len()) {
		t.Errorf("allocated %d MiB for %d KiB of input", n>>20, b.Len()>>10)
	}
	if err == nil || !strings.Contains(err.Error(), `container "vllm": its env and command expand past 2 MiB`) {
		t.Errorf("err = %v, want the container refused for its expansion", err)
	}
}

// TestLargeMappings: kyaml's expansion merges every mapping in time that
// grows with the square of its keys, so it runs only on documents with
// aliases, whose mappings are bounded; a large ConfigMap without aliases
// passes as it came.
func TestLargeMappings(t *testing.T) {
	keys := func(n int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "  k%d: v\n", i)
		}
		return b.String()
	}
	big := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big\ndata:\n" + keys(200_000) + "---\n" + nestedAnchors(2, 2)
	out, err := injectString(t, big, Options{})
	if err != nil || !strings.Contains(out, "  k199999: v\n") {
		t.Fatalf("a large ConfigMap beside an engine: %v", err)
	}
	refused(t, "a large mapping with aliases", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big\n  labels: &l {a: b}\nother: *l\ndata:\n"+keys(maxAliasedKeys+1)+"---\n"+nestedAnchors(2, 2),
		Options{}, `document 1 (ConfigMap "big"): a mapping of 10001 keys in a document with aliases`)
}
