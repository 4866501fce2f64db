package inject

import (
	"fmt"
	"path"
	"regexp"
	"slices"
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
	raw   string // as the manifest writes it
	// mayHold: the word is an expansion inject cannot read, where a shell
	// may split it into several arguments or the kubelet put a whole
	// option in it: it may hold a --port inject cannot see.
	mayHold bool
	// maySplit: a value inject can see becomes several arguments (a
	// known value with blanks, unquoted; a quote the kubelet puts in).
	maySplit bool
	node     *yaml.Node
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
	// assigned: variables the shell line sets anywhere, which the program
	// may see with values inject does not read; prefix: those set on this
	// command alone (PORT=9000 prog), which it surely sees.
	assigned map[string]bool
	prefix   map[string]word
}

// shells are the programs whose -c runs a shell line.
var shells = []string{"sh", "bash", "dash", "ash", "zsh", "ksh"}

// runsOf reads how c starts its programs: its command and args as one
// invocation, or, when they run a shell with -c, each simple command of
// the shell line (in pipelines, lists, conditionals and subshells alike).
func runsOf(c *yaml.RNode, env containerEnv) ([]*invocation, error) {
	var nodes []*yaml.Node
	for _, field := range []string{"command", "args"} {
		if f := c.Field(field); f != nil && f.Value.YNode().Kind == yaml.SequenceNode {
			nodes = append(nodes, f.Value.YNode().Content...)
		}
	}
	exec := &invocation{}
	for _, n := range nodes {
		v, known := env.expand(n.Value)
		// A value the kubelet puts in may be a whole option.
		hold := strings.HasPrefix(v, unknownPart)
		exec.words = append(exec.words, word{value: v, known: known, raw: n.Value, mayHold: hold, node: n, to: len(n.Value)})
	}
	script := shellScript(exec.words)
	if script == nil {
		return []*invocation{exec}, nil
	}
	runs, err := shellRuns(script, env)
	for i, w := range exec.words {
		if w.node == script {
			for _, run := range runs {
				run.positional(exec.words[i+1:])
			}
		}
	}
	return runs, err
}

// positionalRef is a word that passes the shell's own arguments on:
// $0, $1, ${2}, $@, "$@", $*.
var positionalRef = regexp.MustCompile(`^"?\$\{?([0-9]+|@|\*)\}?"?$`)

// positional puts the words the container gives the shell after its line
// (sh -c LINE $0 $1 ...) where the run passes them on: $0 is the first,
// $N the N+1th, $@ and $* all but the first. A --port among them is then
// read, and rewritten, as the program's.
func (run *invocation) positional(trailing []word) {
	var words []word
	for _, w := range run.words {
		m := positionalRef.FindStringSubmatch(w.raw)
		switch {
		case m == nil:
			words = append(words, w)
		case m[1] == "@" || m[1] == "*":
			if len(trailing) > 1 {
				words = append(words, trailing[1:]...)
			}
		default:
			if n, _ := strconv.Atoi(m[1]); n < len(trailing) {
				words = append(words, trailing[n])
			}
		}
	}
	run.words = words
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
		if w == "--" {
			i++
			break
		}
		if len(w) < 2 || (w[0] != '-' && w[0] != '+') {
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

// shellRuns parses a shell line and returns its simple commands.
func shellRuns(script *yaml.Node, env containerEnv) ([]*invocation, error) {
	src := script.Value
	if len(src) > maxArg {
		return nil, fmt.Errorf("the shell line is %d bytes, longer than the kernel passes to a program (%d KiB)", len(src), maxArg>>10)
	}
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
		run := &invocation{shell: script, end: int(call.Args[len(call.Args)-1].End().Offset()), assigned: assigned, prefix: map[string]word{}}
		for _, a := range call.Assigns {
			if a.Name != nil && a.Value != nil && !a.Append && a.Index == nil {
				run.prefix[a.Name.Value] = r.word(a.Value, script)
			}
		}
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
	v, known := unknownPart, false
	switch p := p.(type) {
	case *syntax.Lit:
		v, known = unescape(p.Value, quoted), true
	case *syntax.SglQuoted:
		if !p.Dollar {
			v, known = r.singleQuoted(p.Value, out)
		}
	case *syntax.DblQuoted:
		if !p.Dollar {
			for _, q := range p.Parts {
				r.part(q, true, b, out)
			}
			return
		}
	case *syntax.ParamExp:
		v, known = r.paramPart(p, quoted, out)
	case *syntax.CmdSubst:
		v, known = r.kubeletPart(p, quoted, out)
	}
	out.known = out.known && known
	b.WriteString(v)
}

// singleQuoted is the text of '...': the shell reads none of it, but the
// kubelet expands $(VAR) in it first.
func (r *shellReader) singleQuoted(text string, out *word) (string, bool) {
	v, known := r.env.expand(text)
	if strings.Contains(v, "'") {
		// A quote the kubelet put in ends the shell's quotes.
		out.maySplit = true
		return unknownPart, false
	}
	return v, known
}

// paramPart is a parameter expansion's value, where param reads it.
func (r *shellReader) paramPart(p *syntax.ParamExp, quoted bool, out *word) (string, bool) {
	v, ok := r.param(p, out)
	ok = ok && r.env.spend(len(v))
	// Unquoted, the shell splits what it cannot be shown to be one word.
	out.mayHold = out.mayHold || !quoted && !ok
	out.maySplit = out.maySplit || !quoted && ok && strings.ContainsAny(v, " \t\n")
	if !ok {
		return unknownPart, false
	}
	return v, true
}

// kubeletPart is a $(...) the kubelet replaces before the shell runs (a
// $(VAR) of the container's), read only when its value is one plain word;
// any other command substitution is not read.
func (r *shellReader) kubeletPart(p *syntax.CmdSubst, quoted bool, out *word) (string, bool) {
	text := r.src[p.Pos().Offset():p.End().Offset()]
	m := kubeletRef.FindStringSubmatch(text)
	if m == nil {
		out.mayHold = out.mayHold || !quoted
		return unknownPart, false
	}
	v, defined := r.env.lookup(m[1])
	// A value with blanks or shell syntax changes the line's words once
	// the kubelet puts it in: not read.
	if !defined || !v.known || strings.ContainsAny(v.value, " \t\n;&|<>()$`'\"\\") || !r.env.spend(len(v.value)) {
		out.mayHold = out.mayHold || !quoted
		out.maySplit = out.maySplit || defined && v.known && (!quoted || strings.ContainsAny(v.value, "\"`$\\"))
		return unknownPart, false
	}
	return v.value, true
}

// param reads $VAR, ${VAR}, ${VAR:-default} and ${VAR-default} from the
// container's env; anything else, or a variable the line sets itself, is
// not read.
func (r *shellReader) param(p *syntax.ParamExp, out *word) (string, bool) {
	if !plainParam(p) {
		return "", false
	}
	name := p.Param.Value
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
	return r.defaultValue(p.Exp.Word)
}

// plainParam tells a parameter expansion that names a variable and, at
// most, gives a default: no length, indirection, index, slice or
// replacement.
func plainParam(p *syntax.ParamExp) bool {
	return p.Param != nil && !p.Excl && !p.Length && !p.Width && p.Index == nil && p.Slice == nil && p.Repl == nil && p.Names == 0
}

// defaultValue is the value of a ${VAR:-default}'s default, as the shell
// reads it.
func (r *shellReader) defaultValue(w *syntax.Word) (string, bool) {
	if w == nil {
		return "", true
	}
	var b strings.Builder
	inner := word{known: true}
	for _, q := range w.Parts {
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
				out = append(out, flagValue{word: i + 1, value: v.value, known: v.known, raw: v.raw})
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

// inlineFlag is an option with its value in its own word, after prefix.
func inlineFlag(w word, i int, prefix string) flagValue {
	return flagValue{word: i, inline: true, prefix: prefix, value: w.value[len(prefix):], known: w.known, raw: w.raw}
}

// isDigit tells an ASCII digit.
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

// hidden is the first of the program's arguments that may hold options
// inject cannot see, "" for none: one that splits into several, or an
// expansion inject cannot read where an option could be (not right
// after an option without its value attached: that is its value).
func (run *invocation) hidden() string {
	for i := run.args; i < len(run.words); i++ {
		if run.words[i].maySplit {
			return run.words[i].raw
		}
		if !run.words[i].mayHold {
			continue
		}
		if prev := run.words[i-min(i, 1)].value; i > run.args && strings.HasPrefix(prev, "-") && !strings.Contains(prev, "=") {
			continue
		}
		return run.words[i].raw
	}
	return ""
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
