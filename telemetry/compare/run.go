package compare

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Options are a comparison's settings: `timing-sidecar compare`'s flags.
type Options struct {
	// Inputs are access logs: files, globs, or "-" for standard input.
	// A line's arm is its variant field, else its file's name without
	// extension.
	Inputs []string
	Base   string
	// JSON prints the report as JSON instead of text; HTML, when set,
	// is a file the report is also written to, as a page.
	JSON bool
	HTML string
	// Follow reads the inputs as they grow, and reports every Every
	// with the anytime-valid test, until the context ends or every
	// input does (a file never does).
	Follow bool
	Every  time.Duration
	Seed   uint64
	// tick, in tests, replaces Every's ticker.
	tick <-chan time.Time
}

// stdinArm is the arm of standard input's lines that name none.
const stdinArm = "stdin"

// Run reads the inputs and writes the comparison to stdout (and to
// opts.HTML): once, or as the inputs grow with opts.Follow.
func Run(ctx context.Context, opts Options, stdin io.Reader, stdout io.Writer) error {
	inputs, err := expand(opts.Inputs)
	if err != nil {
		return err
	}
	if opts.Follow && opts.Every <= 0 && opts.tick == nil {
		return errors.New("--every must be a positive duration")
	}
	if !opts.Follow {
		var s Samples
		for _, in := range inputs {
			if err := readInput(in, stdin, &s); err != nil {
				return err
			}
		}
		return write(&s, opts, stdout)
	}
	return follow(ctx, inputs, opts, stdin, stdout)
}

// input is one source of lines and the arm of its lines that name none.
type input struct{ path, arm string }

// expand resolves globs: a pattern that matches nothing is an error, as
// is no input at all.
func expand(args []string) ([]input, error) {
	if len(args) == 0 {
		return nil, errors.New("no access logs: name files, globs, or - for standard input")
	}
	var out []input
	for _, a := range args {
		if a == "-" {
			out = append(out, input{"-", stdinArm})
			continue
		}
		paths, err := filepath.Glob(a)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", a, err)
		}
		if len(paths) == 0 {
			return nil, fmt.Errorf("%q: no such file", a)
		}
		for _, p := range paths {
			out = append(out, input{p, strings.TrimSuffix(filepath.Base(p), filepath.Ext(p))})
		}
	}
	return out, nil
}

func readInput(in input, stdin io.Reader, s *Samples) error {
	if in.path == "-" {
		return s.Read(stdin, in.arm)
	}
	f, err := os.Open(in.path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := s.Read(f, in.arm); err != nil {
		return fmt.Errorf("%s: %w", in.path, err)
	}
	return nil
}

// write builds the report and writes it: text or JSON to stdout, and the
// page to opts.HTML, replaced whole (a browser reloading it never reads
// half of one).
func write(s *Samples, opts Options, stdout io.Writer) error {
	if len(s.Order) < 2 {
		return fmt.Errorf("%d arm(s) read (%s): name arms with the variant field (--variant, --variant-header) or give one file per arm",
			len(s.Order), strings.Join(s.Order, ", "))
	}
	if opts.Base != "" && s.Requests[opts.Base] == 0 {
		return fmt.Errorf("no requests of the base arm %q; arms read: %s", opts.Base, strings.Join(s.Order, ", "))
	}
	r := Build(s, BuildOptions{Base: opts.Base, Seed: opts.Seed, Sequential: opts.Follow})
	if opts.HTML != "" {
		if err := writeFile(opts.HTML, &r); err != nil {
			return err
		}
	}
	if opts.JSON {
		// One document a line: with --follow, one a report.
		return json.NewEncoder(stdout).Encode(r)
	}
	return WriteText(stdout, &r)
}

func writeFile(path string, r *Report) error {
	var b bytes.Buffer
	if err := WriteHTML(&b, r); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b.Bytes(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// line is one line read from an input, or the end of one (done).
type line struct {
	text []byte
	arm  string
	err  error
	done bool
}

// follow reads every input as it grows and reports at each tick, and
// when every input has ended.
func follow(ctx context.Context, inputs []input, opts Options, stdin io.Reader, stdout io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lines := make(chan line, 1024)
	var wg sync.WaitGroup
	for _, in := range inputs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tail(ctx, in, stdin, lines)
		}()
	}
	tick := opts.tick
	if tick == nil {
		t := time.NewTicker(opts.Every)
		defer t.Stop()
		tick = t.C
	}
	var s Samples
	open := len(inputs)
	for open > 0 {
		select {
		case l := <-lines:
			switch {
			case l.err != nil:
				return l.err
			case l.done:
				open--
			default:
				if err := s.Add(l.text, l.arm); err != nil {
					return err
				}
			}
		case <-tick:
			if err := report(&s, opts, stdout); err != nil {
				return err
			}
		case <-ctx.Done():
			open = 0
		}
	}
	cancel()
	go func() { wg.Wait(); close(lines) }()
	for range lines {
		// Tails stopping: what they still hold is past the end.
	}
	return report(&s, opts, stdout)
}

// report writes a report while following: too few arms yet is said, not
// an error.
func report(s *Samples, opts Options, stdout io.Writer) error {
	if len(s.Order) < 2 {
		_, err := fmt.Fprintf(stdout, "%s: waiting for two arms (%d read, %d requests)\n", time.Now().UTC().Format(time.RFC3339), len(s.Order), s.n)
		return err
	}
	if !opts.JSON {
		fmt.Fprintf(stdout, "\n=== %s, %d requests\n", time.Now().UTC().Format(time.RFC3339), s.n)
	}
	return write(s, opts, stdout)
}

// pollInterval is how often a followed file at its end is read again.
const pollInterval = 250 * time.Millisecond

// tail sends in's lines, bounded by MaxLine; at a file's end it waits
// for more, from the start again if the file was cut (rotated by
// copytruncate). Standard input ends at its end.
func tail(ctx context.Context, in input, stdin io.Reader, out chan<- line) {
	send := func(l line) bool {
		select {
		case out <- l:
			return true
		case <-ctx.Done():
			return false
		}
	}
	var r io.Reader = stdin
	var f *os.File
	if in.path != "-" {
		var err error
		if f, err = os.Open(in.path); err != nil {
			send(line{err: err})
			return
		}
		defer f.Close()
		r = f
	}
	br := bufio.NewReaderSize(r, 64<<10)
	var partial []byte
	for {
		chunk, err := br.ReadSlice('\n')
		partial = append(partial, chunk...)
		if len(partial) > MaxLine {
			send(line{err: fmt.Errorf("%s: %w", in.path, errTooLong)})
			return
		}
		switch {
		case err == nil:
			if !send(line{text: bytes.Clone(partial), arm: in.arm}) {
				return
			}
			partial = partial[:0]
		case errors.Is(err, bufio.ErrBufferFull):
		case errors.Is(err, io.EOF) && f != nil:
			if !waitForMore(ctx, f, br, &partial) {
				return
			}
		default:
			if len(partial) > 0 {
				send(line{text: bytes.Clone(partial), arm: in.arm})
			}
			if !errors.Is(err, io.EOF) {
				send(line{err: fmt.Errorf("%s: %w", in.path, err)})
			}
			send(line{done: true})
			return
		}
	}
}

// waitForMore waits a poll interval at a file's end; a file now shorter
// than what was read was cut, and is read again from its start.
func waitForMore(ctx context.Context, f *os.File, br *bufio.Reader, partial *[]byte) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(pollInterval):
	}
	at, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return false
	}
	if st, err := f.Stat(); err == nil && st.Size() < at {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return false
		}
		*partial = (*partial)[:0]
	}
	br.Reset(f)
	return true
}
