package spool

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// request is what the property test knows of one request's entries.
type request struct {
	// startTook and endTook say the spool took the entry; durable, that
	// a Sync returned nil after it did.
	startTook, startDurable bool
	endTook, endDurable     bool
	// cancelled says its end was refused and its start cancelled: it
	// has no record, or its start's if the cancel did not reach the disk.
	cancelled bool
	// cut says a power cut (or a kill after a failed sync) came since it
	// was taken: what was not synced then may or may not be on the disk,
	// and a later sync says nothing of it.
	cut bool
}

// powerCutRun is one randomized run of the property test.
type powerCutRun struct {
	t    *testing.T
	rng  *rand.Rand
	fs   *faultFS
	s    *Spool
	reqs map[string]*request
	// inflight is the ids this process started and has not ended.
	inflight []string
	// delivered is each reader's contents, by id.
	delivered map[string]map[string][]string
	next      int
	faults    int
	// steps is what the run did, for a failure's log.
	steps []string
	// failing is the kinds of operation the disk fails now.
	failing map[string]bool
	// syncFailed says the last Sync failed: what it was to make durable
	// may be lost to a kill too (a failed segment is cut back to what
	// its file holds on the disk).
	syncFailed bool
}

func (p *powerCutRun) note(format string, args ...any) {
	p.steps = append(p.steps, fmt.Sprintf(format, args...))
}

var powerCutReaders = []string{"a", "b"}

func (p *powerCutRun) open() {
	s, rec, err := Open(Options{fs: p.fs, noSyncLoop: true, Dir: faultDir, MaxSize: 1 << 30, SegmentSize: 1 << 11, Readers: powerCutReaders})
	if err != nil {
		p.t.Fatal(err)
	}
	p.note("opened: %+v; files %s", rec, p.fs)
	p.s = s
	p.inflight = nil
}

// restart ends the process as a kill or a power cut does, and starts
// another on what the disk then holds.
func (p *powerCutRun) restart(cut bool) {
	p.stop(cut)
	if p.rng.IntN(2) == 0 {
		p.fault() // the disk fails on as the next process starts
	}
	p.open()
}

// stop ends the process.
func (p *powerCutRun) stop(cut bool) {
	p.note("restart, power cut %v; files %s", cut, p.fs)
	abandon(p.s)
	if cut || p.syncFailed {
		for _, rq := range p.reqs {
			rq.cut = true
		}
	}
	p.syncFailed, p.failing = false, nil
	if cut {
		p.fs = p.fs.cut(cutMode{keepDirOps: []float64{0, 0.5, 1}[p.rng.IntN(3)], torn: p.rng.IntN(2) == 0, rng: p.rng})
	} else {
		p.fs = p.fs.kill()
	}
}

// fault makes one kind of operation fail, at random, from now on.
// A failing disk fails several kinds of operation at once: each fault
// adds one, until the faults are cleared.
func (p *powerCutRun) fault() {
	op := []string{"write", "sync", "truncate", "rename", "create", "syncdir", "remove", "reserve"}[p.rng.IntN(8)]
	p.note("fault: %s", op)
	if p.failing == nil {
		p.failing = map[string]bool{}
	}
	p.failing[op] = true
	failing, rng := p.failing, p.rng
	p.fs.mu.Lock()
	p.fs.fault = func(o, name string, n int) (int, error) {
		if !failing[o] || rng.IntN(3) != 0 {
			return n, nil
		}
		p.note("  %s %s fails", o, name)
		p.faults++
		return rng.IntN(max(n, 1)), []error{syscall.ENOSPC, syscall.EIO}[rng.IntN(2)]
	}
	p.fs.rng = rng
	p.fs.mu.Unlock()
}

func (p *powerCutRun) start() {
	id := fmt.Sprintf("r%05d", p.next)
	p.next++
	rq := &request{}
	p.reqs[id] = rq
	if err := p.s.Append(Start, id, []byte("start of "+id)); err == nil {
		p.note("start %s", id)
		rq.startTook = true
		p.inflight = append(p.inflight, id)
	}
}

func (p *powerCutRun) end() {
	if len(p.inflight) == 0 {
		return
	}
	i := p.rng.IntN(len(p.inflight))
	id := p.inflight[i]
	p.inflight = slices.Delete(p.inflight, i, i+1)
	if p.s.Append(End, id, []byte("end of "+id)) == nil {
		p.note("end %s", id)
		p.reqs[id].endTook = true
		return
	}
	p.note("end %s refused, cancelled", id)
	p.s.Cancel(id)
	p.reqs[id].cancelled = true
}

func (p *powerCutRun) sync() {
	if err := p.s.Sync(); err != nil {
		p.note("sync: %v", err)
		p.syncFailed = true
		return
	}
	p.note("synced")
	p.syncFailed = false
	for _, rq := range p.reqs {
		if !rq.cut {
			rq.startDurable = rq.startDurable || rq.startTook
			rq.endDurable = rq.endDurable || rq.endTook
		}
	}
}

// deliver reads one batch for a reader, and acknowledges it, mostly.
func (p *powerCutRun) deliver(name string) {
	r := p.s.Reader(name)
	b, err := r.Next(1+p.rng.IntN(20), 1<<20)
	if err != nil {
		p.t.Fatalf("reader %s: %v", name, err)
	}
	for _, rec := range b.Records {
		id := string(rec.ID)
		p.delivered[name][id] = append(p.delivered[name][id], string(rec.Data))
	}
	if p.rng.IntN(10) != 0 {
		r.Ack(b) //nolint:errcheck // a position not saved only delivers again
	}
}

func (p *powerCutRun) step() {
	switch n := p.rng.IntN(100); {
	case n < 30:
		p.start()
	case n < 58:
		p.end()
	case n < 68:
		p.sync()
	case n < 88:
		p.deliver(powerCutReaders[n%2])
	case n < 92:
		p.fault()
	case n < 96:
		p.fs.mu.Lock()
		p.fs.fault, p.failing = nil, nil
		p.fs.mu.Unlock()
	case n < 98:
		p.restart(false)
	default:
		p.restart(true)
	}
}

// finish ends the run: the process killed with requests in flight, a
// clean restart, every record delivered.
func (p *powerCutRun) finish() {
	p.stop(false)
	p.open()
	for _, name := range powerCutReaders {
		for range 100000 {
			p.s.Sync() //nolint:errcheck // no faults now
			b, err := p.s.Reader(name).Next(1000, 1<<20)
			if err != nil {
				p.t.Fatal(err)
			}
			if len(b.Records) == 0 {
				break
			}
			for _, rec := range b.Records {
				p.delivered[name][string(rec.ID)] = append(p.delivered[name][string(rec.ID)], string(rec.Data))
			}
			p.s.Reader(name).Ack(b) //nolint:errcheck // no faults now
		}
		if n := p.s.Reader(name).Pending(); n != 0 {
			p.t.Errorf("reader %s: %d pending after delivering everything", name, n)
		}
	}
}

// check holds the run to the spool's promises.
func (p *powerCutRun) check() {
	for id, rq := range p.reqs {
		var first string
		for _, name := range powerCutReaders {
			got := slices.Compact(slices.Clone(p.delivered[name][id]))
			switch {
			case len(got) > 1:
				p.t.Errorf("%s: reader %s got %q: one id, two contents", id, name, got)
			case len(got) == 1 && first != "" && got[0] != first:
				p.t.Errorf("%s: the readers got %q and %q", id, first, got[0])
			case len(got) == 1 && (!rq.startTook || got[0] == "end of "+id && !rq.endTook):
				p.t.Errorf("%s: reader %s got %q, which the spool never took", id, name, got[0])
			case len(got) == 0 && rq.endDurable:
				p.t.Errorf("%s: its end was synced, and reader %s never got it", id, name)
			case len(got) == 0 && rq.startDurable && !rq.cancelled:
				p.t.Errorf("%s: its start was synced, and reader %s never got a record", id, name)
			case len(got) == 1 && rq.endDurable && got[0] != "end of "+id:
				p.t.Errorf("%s: its end was synced, and reader %s got %q", id, name, got[0])
			}
			if len(got) == 1 {
				first = got[0]
			}
		}
	}
}

// TestPowerCutsKeepEveryRecordWhole: over thousands of random operations
// (starts, ends, syncs, deliveries, faults of every kind the file layer
// injects, kills and power cuts at any point), every request has at most
// one record content across every delivery and restart, none whose start
// was synced goes without a record, and none whose end was synced is
// delivered as anything else.
func TestPowerCutsKeepEveryRecordWhole(t *testing.T) {
	// TIMING_SIDECAR_POWERCUT_SEEDS runs more, from a given one:
	// "5000" or "5000@10000".
	first, seeds, steps := 0, 200, 2500
	if testing.Short() {
		seeds = 10
	}
	if v := os.Getenv("TIMING_SIDECAR_POWERCUT_SEEDS"); v != "" {
		n, from, _ := strings.Cut(v, "@")
		seeds, _ = strconv.Atoi(n)
		first, _ = strconv.Atoi(from)
	}
	total := 0
	for seed := first; seed < first+seeds; seed++ {
		p := &powerCutRun{t: t, rng: rand.New(rand.NewPCG(uint64(seed), 54)), fs: newFaultFS(), reqs: map[string]*request{},
			delivered: map[string]map[string][]string{"a": {}, "b": {}}}
		p.open()
		for range steps {
			p.step()
		}
		p.finish()
		p.check()
		abandon(p.s)
		total += p.faults
		if t.Failed() {
			for _, step := range p.steps[max(0, len(p.steps)-traceSteps):] {
				t.Log(step)
			}
			t.Fatalf("seed %d failed", seed)
		}
	}
	t.Logf("%d runs of %d operations, %d injected faults", seeds, steps, total)
}

// traceSteps is how many of a failed run's last steps its log shows.
var traceSteps = 120
