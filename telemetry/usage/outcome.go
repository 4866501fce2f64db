package usage

import (
	"errors"
	"fmt"

	"github.com/timing-sidecar/timing-sidecar/telemetry/spool"
)

// A sink's Send says what became of a batch: nil (acknowledged whole),
// *Partial (acknowledged, some records refused), *Rejected (refused for
// good), or any other error (to send again after a backoff).

// Rejected is a sink's refusal of a batch that sending it again would not
// change: a CloudEvents receiver's 400, 413 or 422, or one of OTLP's
// non-retryable answers. The record or the endpoint: delivery.deliver
// tells which.
type Rejected struct {
	// Status is the answer: an HTTP status line, or a gRPC code.
	Status string
	// TooLarge says the batch was refused for its size (413).
	TooLarge bool
}

func (r *Rejected) Error() string { return fmt.Sprintf("the sink refused the batch (%s)", r.Status) }

// Partial is a sink's acknowledgement of a batch with some of its records
// refused: OTLP's partial success. The collector says how many, not
// which, so the batch is delivered, and Rejected of its records counted
// refused. Rejected 0 with a Message is a warning.
type Partial struct {
	Rejected int
	Message  string
}

func (p *Partial) Error() string {
	return fmt.Sprintf("the sink took the batch, refusing %d of its records: %s", p.Rejected, p.Message)
}

// EndpointRefuses is a batch and both its halves refused: the endpoint
// refuses everything (a wrong path, a receiver that takes another
// format), not one record. It is retried with a backoff, and logged as a
// configuration error; dropping records one by one would drop them all.
type EndpointRefuses struct{ *Rejected }

func (e *EndpointRefuses) Error() string {
	return fmt.Sprintf("the sink refuses every record sent (%s)", e.Status)
}

func (e *EndpointRefuses) Unwrap() error { return e.Rejected }

// probeBatch is the batch sent after the endpoint seemed to refuse
// everything: split down to single records, at most 2×16−1 sends.
const probeBatch = 16

// deliver sends records, and returns how many the sink refused.
//
// A batch the sink rejects is split in halves. If both are refused too,
// the endpoint seems to refuse everything (a wrong path, a receiver that
// takes another format): nothing is dropped, and the delivery probes after
// a backoff (probe). If the sink takes one half, it takes records, and
// the refused half is split until the records refused alone are found;
// those are dropped, logged and counted, so that one bad record never
// holds the rest. A 413 (too large) is split down whatever its halves
// say.
func (d *delivery) deliver(records []spool.Record, probe bool) (rejected int, err error) {
	if probe {
		return d.probe(records)
	}
	err = d.sink.Send(d.stopped, records)
	var rej *Rejected
	if !errors.As(err, &rej) {
		return d.partial(err, len(records))
	}
	if len(records) == 1 {
		return 0, &EndpointRefuses{rej}
	}
	half := len(records) / 2
	halves := [2][]spool.Record{records[:half], records[half:]}
	var n [2]int
	var errs [2]error
	var refused [2]bool
	for i, h := range halves {
		n[i], errs[i] = d.sendWhole(h)
		refused[i] = errors.As(errs[i], new(*Rejected))
	}
	if refused[0] && refused[1] && !rej.TooLarge {
		return 0, &EndpointRefuses{rej}
	}
	if err := errors.Join(retryable(errs[0]), retryable(errs[1])); err != nil {
		return 0, err
	}
	// The sink takes records: what it refuses now is the record's.
	var t tally
	for i, h := range halves {
		if !refused[i] {
			t.took(len(h), n[i])
		} else if err := d.drill(h, &t); err != nil {
			return 0, err
		}
	}
	return d.drop(t), nil
}

// probe delivers a batch of at most probeBatch records split down to
// single records: the records refused alone are dropped only when the
// sink took another, so that bad records spread over a batch (which
// refuses it and both its halves) are found, and an endpoint that refuses
// every record loses none.
func (d *delivery) probe(records []spool.Record) (int, error) {
	var t tally
	if err := d.drill(records, &t); err != nil {
		return 0, err
	}
	if t.accepted == 0 && len(t.refused) > 0 {
		return 0, &EndpointRefuses{&Rejected{Status: "every record refused alone"}}
	}
	return d.drop(t), nil
}

// tally is what sending a refused batch in parts found.
type tally struct {
	// accepted is the records the sink took; partial, those it refused
	// in a partial success; refused, those it refused alone.
	accepted, partial int
	refused           []spool.Record
}

// took counts sent records the sink took, refusing partial of them.
func (t *tally) took(sent, partial int) {
	t.accepted += sent - partial
	t.partial += partial
}

// drill sends records, splitting each refused batch down to single
// records.
func (d *delivery) drill(records []spool.Record, t *tally) error {
	n, err := d.sendWhole(records)
	switch {
	case err == nil:
		t.took(len(records), n)
		return nil
	case !errors.As(err, new(*Rejected)):
		return err
	case len(records) == 1:
		t.refused = append(t.refused, records[0])
		return nil
	}
	half := len(records) / 2
	if err := d.drill(records[:half], t); err != nil {
		return err
	}
	return d.drill(records[half:], t)
}

// drop logs the records the sink refused alone, and returns how many it
// refused in all.
func (d *delivery) drop(t tally) int {
	for _, r := range t.refused {
		d.rejects.report("usage record refused by its sink, and dropped", "sink", d.sink.Name(), "id", string(r.ID))
	}
	return t.partial + len(t.refused)
}

// sendWhole sends records once: what the sink refused of them when it
// took them, or its error.
func (d *delivery) sendWhole(records []spool.Record) (int, error) {
	return d.partial(d.sink.Send(d.stopped, records), len(records))
}

// partial reads a sink's answer: a partial success is the batch
// delivered, with the records it refused counted and its message logged.
func (d *delivery) partial(err error, sent int) (int, error) {
	var p *Partial
	if !errors.As(err, &p) {
		return 0, err
	}
	p.Rejected = min(max(p.Rejected, 0), sent)
	if p.Rejected > 0 {
		d.partials.report("usage records refused by the collector in a partial success, and dropped", "sink", d.sink.Name(), "rejected", p.Rejected, "message", p.Message)
	} else {
		d.partials.report("the collector took the usage records with a warning", "sink", d.sink.Name(), "message", p.Message)
	}
	return p.Rejected, nil
}

// retryable is err unless it is a refusal.
func retryable(err error) error {
	var rej *Rejected
	if errors.As(err, &rej) {
		return nil
	}
	return err
}
