package inject

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"mvdan.cc/sh/v3/syntax"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// unknownPart stands in a word's value for what inject cannot read (a
// variable set from a secret, a command substitution): no manifest
// writes it, so a value that holds it is never mistaken for a number.
const unknownPart = "\x00"

// word is one argument as the program it is passed to receives it.
type word struct {
	value string // unknownPart where a part cannot be read
	known bool
	raw   string   // as the manifest writes it
	vars  []string // the variables it reads
	node  *yaml.Node
	// from, to: its bytes in node.Value, when node is a shell line;
	// otherwise the word is the whole scalar.
	from, to int
	inShell  bool
}

// invocation is one start of a program, as a container's command and
// args give it, or as one simple command of a shell line does.
type invocation struct {
	words []word
	// args is where the program's own arguments begin, once it is known
	// which program it runs.
	args int
	// shell is the scalar holding the shell line it is on; nil when the
	// words are the container's command and args themselves.
	shell *yaml.Node
	end   int // in a shell line: after its last word, where a word goes
}

// shells are the programs whose -c runs a shell line.
var shells = []string{"sh", "bash", "dash", "ash", "zsh", "ksh"}

// runsOf reads how c starts its programs: its command and args as one
// invocation, or, when they run a shell with -c, each simple command of
// the shell line (in pipelines, lists, conditionals and subshells alike).
// script is the scalar of the shell line, nil without one.
func runsOf(c *yaml.RNode, env containerEnv) (runs []*invocation, script *yaml.Node, err error) {
	var nodes []*yaml.Node
	for _, field := range []string{"command", "args"} {
		if f := c.Field(field); f != nil && f.Value.YNode().Kind == yaml.SequenceNode {
			nodes = append(nodes, f.Value.YNode().Content...)
		}
	}
	exec := &invocation{}
	for _, n := range nodes {
		v, known := env.expand(n.Value)
		exec.words = append(exec.words, word{value: v, known: known, raw: n.Value, vars: kubeletVars(n.Value), node: n, to: len(n.Value)})
	}
	script = shellScript(exec.words)
	if script == nil {
		return []*invocation{exec}, nil, nil
	}
	runs, err = shellRuns(script, env)
	for i, w := range exec.words {
		if w.node == script {
			for _, run := range runs {
				run.positional(exec.words[i+1:])
			}
		}
	}
	return runs, script, err
}

// positionalRef is a word that passes the shell's own arguments on: $0,
// $@, "$@", $*, ${1}.
var positionalRef = regexp.MustCompile(`^"?\$\{?[0-9@*]\}?"?$`)

// positional puts the words the container gives the shell after its line
// (sh -c LINE $0 $1 ...) where the run passes them on, so that a --port
// among them is read, and rewritten, as the program's.
func (run *invocation) positional(trailing []word) {
	for i, w := range run.words {
		if !positionalRef.MatchString(w.raw) {
			continue
		}
		var words []word
		for _, rest := range run.words[i:] {
			if !positionalRef.MatchString(rest.raw) {
				words = append(words, rest)
			}
		}
		run.words = append(append(run.words[:i:i], trailing...), words...)
		return
	}
}

// shellScript is the scalar a shell runs with -c (sh -c, bash -ec,
// bash -o pipefail -c), or nil.
func shellScript(words []word) *yaml.Node {
	if len(words) < 2 || !slices.Contains(shells, path.Base(words[0].value)) {
		return nil
	}
	withC := false
	i := 1
	for ; i < len(words); i++ {
		w := words[i].value
		if w == "-o" || w == "+o" {
			i++
			continue
		}
		if w == "--" || len(w) < 2 || (w[0] != '-' && w[0] != '+') {
			break
		}
		withC = withC || (w[0] == '-' && strings.Contains(w[1:], "c"))
	}
	if !withC || i >= len(words) {
		return nil
	}
	return words[i].node
}

// kubeletRef is $(NAME) written alone: the kubelet replaces it when the
// container defines NAME, before any shell sees it.
var kubeletRef = regexp.MustCompile(`^\$\(([^()\s]+)\)$`)

// kubeletVars is the names s refers to as $(NAME).
func kubeletVars(s string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`\$\(([^()\s]+)\)`).FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}

// shellRuns parses a shell line and returns its simple commands.
func shellRuns(script *yaml.Node, env containerEnv) ([]*invocation, error) {
	src := script.Value
	file, err := syntax.NewParser(syntax.KeepComments(true), syntax.Variant(syntax.LangBash)).Parse(strings.NewReader(src), "")
	if err != nil {
		return nil, fmt.Errorf("the shell line does not parse: %w", err)
	}
	// Variables the line sets itself are not the container's.
	assigned := map[string]bool{}
	syntax.Walk(file, func(n syntax.Node) bool {
		if a, ok := n.(*syntax.Assign); ok && a.Name != nil {
			assigned[a.Name.Value] = true
		}
		return true
	})
	r := shellReader{src: src, env: env, assigned: assigned}
	var runs []*invocation
	syntax.Walk(file, func(n syntax.Node) bool {
		call, ok := n.(*syntax.CallExpr)
		if !ok || len(call.Args) == 0 {
			return true
		}
		run := &invocation{shell: script, end: int(call.Args[len(call.Args)-1].End().Offset())}
		for _, w := range call.Args {
			run.words = append(run.words, r.word(w, script))
		}
		runs = append(runs, run)
		return true
	})
	return runs, nil
}

// shellReader reads a shell word's value as the program gets it: quotes
// removed, the container's variables and the kubelet's $(VAR) put in.
type shellReader struct {
	src      string
	env      containerEnv
	assigned map[string]bool
}

func (r *shellReader) word(w *syntax.Word, script *yaml.Node) word {
	from, to := int(w.Pos().Offset()), int(w.End().Offset())
	out := word{known: true, raw: r.src[from:to], node: script, from: from, to: to, inShell: true}
	var b strings.Builder
	for _, p := range w.Parts {
		r.part(p, false, &b, &out)
	}
	out.value = b.String()
	return out
}

func (r *shellReader) part(p syntax.WordPart, quoted bool, b *strings.Builder, out *word) {
	unknown := func() {
		out.known = false
		b.WriteString(unknownPart)
	}
	switch p := p.(type) {
	case *syntax.Lit:
		b.WriteString(unescape(p.Value, quoted))
	case *syntax.SglQuoted:
		if p.Dollar {
			unknown()
			return
		}
		// The kubelet expands $(VAR) before the shell sees the quotes.
		v, known := r.env.expand(p.Value)
		out.known = out.known && known
		out.vars = append(out.vars, kubeletVars(p.Value)...)
		b.WriteString(v)
	case *syntax.DblQuoted:
		if p.Dollar {
			unknown()
			return
		}
		for _, q := range p.Parts {
			r.part(q, true, b, out)
		}
	case *syntax.ParamExp:
		v, ok := r.param(p, out)
		if !ok {
			unknown()
			return
		}
		b.WriteString(v)
	case *syntax.CmdSubst:
		text := r.src[p.Pos().Offset():p.End().Offset()]
		m := kubeletRef.FindStringSubmatch(text)
		if m == nil {
			unknown()
			return
		}
		out.vars = append(out.vars, m[1])
		v, defined := r.env.lookup(m[1])
		// A value with blanks or shell syntax changes the line's words
		// once the kubelet puts it in: not read.
		if !defined || !v.known || strings.ContainsAny(v.value, " \t\n;&|<>()$`'\"\\") {
			unknown()
			return
		}
		b.WriteString(v.value)
	default:
		unknown()
	}
}

// param reads $VAR, ${VAR}, ${VAR:-default} and ${VAR-default} from the
// container's env; anything else, or a variable the line sets itself, is
// not read.
func (r *shellReader) param(p *syntax.ParamExp, out *word) (string, bool) {
	if p.Param == nil || p.Excl || p.Length || p.Width || p.Index != nil || p.Slice != nil || p.Repl != nil || p.Names != 0 {
		return "", false
	}
	name := p.Param.Value
	out.vars = append(out.vars, name)
	if r.assigned[name] {
		return "", false
	}
	v, defined := r.env.lookup(name)
	if p.Exp == nil {
		return v.value, defined && v.known
	}
	if p.Exp.Op != syntax.DefaultUnset && p.Exp.Op != syntax.DefaultUnsetOrNull {
		return "", false
	}
	if defined && !v.known {
		return "", false
	}
	if defined && (v.value != "" || p.Exp.Op == syntax.DefaultUnset) {
		return v.value, true
	}
	if p.Exp.Word == nil {
		return "", true
	}
	var b strings.Builder
	inner := word{known: true}
	for _, q := range p.Exp.Word.Parts {
		r.part(q, false, &b, &inner)
	}
	return b.String(), inner.known
}

// unescape removes a shell's backslashes from literal text: all of them
// outside quotes, those before $ ` " \ and a line break inside double
// quotes; a backslash and a line break join the lines.
func unescape(s string, quoted bool) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		next := s[i+1]
		switch {
		case next == '\n':
			i++
		case !quoted || strings.IndexByte("$`\"\\", next) >= 0:
			b.WriteByte(next)
			i++
		default:
			b.WriteByte('\\')
		}
	}
	return b.String()
}

// A flagValue is one occurrence of an option and its value: "--port V",
// "--port=V", and for a short option "-p V", "-pV" and "-p=V".
type flagValue struct {
	word   int  // the index of the word holding the value
	inline bool // the value is in the option's own word, after prefix
	prefix string
	value  string
	known  bool
	raw    string
	vars   []string
}

// flags returns every occurrence of any of names among the program's
// arguments, in order.
func (run *invocation) flags(names []string) []flagValue {
	var out []flagValue
	words := run.words
	for i := run.args; i < len(words); i++ {
		w := words[i].value
		for _, name := range names {
			short := !strings.HasPrefix(name, "--")
			switch {
			case w == name && i+1 < len(words):
				v := words[i+1]
				out = append(out, flagValue{word: i + 1, value: v.value, known: v.known, raw: v.raw, vars: v.vars})
			case strings.HasPrefix(w, name+"="):
				out = append(out, inlineFlag(words[i], i, name+"="))
			case short && len(w) > len(name) && strings.HasPrefix(w, name) && (isDigit(w[len(name)]) || w[len(name):len(name)+1] == unknownPart):
				out = append(out, inlineFlag(words[i], i, name))
			default:
				continue
			}
			break
		}
	}
	return out
}

func inlineFlag(w word, i int, prefix string) flagValue {
	return flagValue{word: i, inline: true, prefix: prefix, value: w.value[len(prefix):], known: w.known, raw: w.raw, vars: w.vars}
}

func isDigit(b byte) bool { return b >= '0' && b <= '9' }

// flag is the last occurrence of any of names, the one argparse and clap
// take.
func (run *invocation) flag(names []string) (flagValue, bool) {
	all := run.flags(names)
	if len(all) == 0 {
		return flagValue{}, false
	}
	return all[len(all)-1], true
}

// has tells whether the program is given the option name, alone.
func (run *invocation) has(name string) bool {
	for _, w := range run.words[run.args:] {
		if w.value == name {
			return true
		}
	}
	return false
}

// An edit changes a scalar of the manifest: a word of a shell line, in
// place, or a whole command or args element.
type edit struct {
	node     *yaml.Node
	from, to int
	text     string
	whole    bool
	// appendArgs are words added to container's args.
	appendArgs []string
	container  *yaml.RNode
}

// setWord is the edit that makes word i of run say text.
func (run *invocation) setWord(i int, text string) edit {
	w := run.words[i]
	if w.inShell {
		return edit{node: w.node, from: w.from, to: w.to, text: text}
	}
	return edit{node: w.node, text: text, whole: true}
}

// apply makes the edits, those in one shell line from its end backwards
// so that each one's offsets still hold.
func apply(edits []edit) {
	sort.SliceStable(edits, func(i, j int) bool { return edits[i].from > edits[j].from })
	for _, e := range edits {
		if e.container != nil {
			args := e.container.Field("args")
			if args == nil {
				e.container.PipeE(yaml.SetField("args", yaml.NewListRNode())) //nolint:errcheck // a new field on a mapping
				args = e.container.Field("args")
			}
			for _, a := range e.appendArgs {
				args.Value.YNode().Content = append(args.Value.YNode().Content, quoted(a))
			}
			continue
		}
		if e.whole {
			e.node.Value, e.node.Tag = e.text, "!!str"
			if _, err := strconv.Atoi(e.text); err == nil {
				// A number stays a string: command and args are strings.
				e.node.Style = yaml.DoubleQuotedStyle
			}
			continue
		}
		e.node.Value = e.node.Value[:e.from] + e.text + e.node.Value[e.to:]
	}
}
