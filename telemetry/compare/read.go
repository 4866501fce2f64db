package compare

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"

	"github.com/tidwall/gjson"
)

// Metrics is the access-log fields a comparison reads: each request's
// figures where measured (a null is not observed, never a zero).
var Metrics = []string{
	"time_to_first_token_ms", "mean_itl_ms", "max_itl_ms", "e2e_latency_ms",
	"queue_time_ms", "tokens_per_second", "prefill_tokens_per_second",
}

// Bounds on what is read: a line past MaxLine is refused, as is input
// past MaxRequests lines, with an error that says so.
const (
	MaxLine     = 1 << 20
	MaxRequests = 10_000_000
)

// Request is what a comparison takes of one access-log line.
type Request struct {
	Arm     string
	Stratum Stratum
	// Time is the line's time, zero if it has none.
	Time time.Time
	// Failed says the request failed: a 5xx, or an engine failure. It
	// counts in the arm's error rate, and its figures are left out.
	Failed bool
	Values map[string]float64
}

// ParseLine reads one access-log line: its arm from the variant field,
// else arm; its stratum (stratum); its figures. ok is false for a line
// that is not a request's (another log line, or not JSON).
//
// A request whose client left before the end (client_gone), or held the
// engine back 10 ms or more (client_stall_ms), keeps its count but not
// its figures: they are the client's pace as much as the engine's, and
// the Prometheus histograms leave them out for the same reason.
func ParseLine(line []byte, arm string) (r Request, ok bool) {
	if !gjson.ValidBytes(line) {
		return r, false
	}
	fields := gjson.GetManyBytes(line, "msg", "variant", "status", "upstream_error", "client_gone", "client_stall_ms", "time")
	if fields[0].String() != "request" {
		return r, false
	}
	r.Arm = arm
	if v := fields[1].String(); v != "" {
		r.Arm = v
	}
	r.Failed = fields[2].Int() >= 500 || fields[3].String() != ""
	r.Stratum = stratum(line)
	r.Time, _ = time.Parse(time.RFC3339Nano, fields[6].String())
	r.Values = map[string]float64{}
	if r.Failed || fields[4].Bool() || fields[5].Float() >= clientPaced {
		return r, true
	}
	for i, v := range gjson.GetManyBytes(line, Metrics...) {
		if v.Type == gjson.Number {
			r.Values[Metrics[i]] = v.Float()
		}
	}
	return r, true
}

// clientPaced is the client stall, in ms, past which a request's
// figures are the client's: the recorder's threshold.
const clientPaced = 10

// Stratum is a class of like requests: the endpoint, the model, the
// prompt-cache class, and the prompt's and completion's lengths in
// buckets a quarter of the next apart (up to 256, 1k, 4k, 16k tokens, or
// more), unknown where the log says none.
type Stratum struct {
	Endpoint   string `json:"endpoint"`
	Model      string `json:"model"`
	Cache      string `json:"cache"`
	Prompt     string `json:"prompt"`
	Completion string `json:"completion"`
}

// String is the stratum as one line: its key in a comparison.
func (s Stratum) String() string {
	return fmt.Sprintf("endpoint=%s model=%s cache=%s prompt=%s completion=%s",
		s.Endpoint, s.Model, s.Cache, s.Prompt, s.Completion)
}

func stratum(line []byte) Stratum {
	f := gjson.GetManyBytes(line, "path", "model", "cache", "prompt_tokens", "completion_tokens")
	cache := f[2].String()
	if cache == "" {
		cache = "unknown"
	}
	return Stratum{Endpoint: f[0].String(), Model: f[1].String(), Cache: cache, Prompt: bucket(f[3]), Completion: bucket(f[4])}
}

func bucket(v gjson.Result) string {
	if v.Type != gjson.Number {
		return "unknown"
	}
	for _, b := range []struct {
		most int64
		name string
	}{{256, "≤256"}, {1024, "≤1k"}, {4096, "≤4k"}, {16384, "≤16k"}} {
		if v.Int() <= b.most {
			return b.name
		}
	}
	return ">16k"
}

// Samples is what a comparison has read: by arm, each metric's values by
// stratum, and the requests and failures.
type Samples struct {
	Values           map[string]map[string]map[Stratum][]float64 // arm → metric → stratum → values
	Requests, Failed map[string]int                              // by arm
	// Served is each arm's requests that did not fail, by stratum.
	Served map[string]map[string]int
	// First and Last are each arm's earliest and latest line times.
	First, Last map[string]time.Time
	// Order is the arms in the order they were first read.
	Order []string
	n     int // requests in all
}

// Read reads access-log lines from r into s, each line's arm its variant
// field or arm. Lines that are not requests' are passed over.
func (s *Samples) Read(r io.Reader, arm string) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), MaxLine)
	for sc.Scan() {
		if err := s.Add(sc.Bytes(), arm); err != nil {
			return err
		}
	}
	if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
		return errTooLong
	} else if err != nil {
		return err
	}
	return nil
}

var errTooLong = fmt.Errorf("a line longer than %d bytes: not an access log", MaxLine)

// Add reads one access-log line into s, its arm its variant field or
// arm; a line that is not a request's is passed over.
func (s *Samples) Add(line []byte, arm string) error {
	if s.Values == nil {
		s.Values, s.Requests, s.Failed = map[string]map[string]map[Stratum][]float64{}, map[string]int{}, map[string]int{}
		s.Served = map[string]map[string]int{}
		s.First, s.Last = map[string]time.Time{}, map[string]time.Time{}
	}
	req, ok := ParseLine(line, arm)
	if !ok {
		return nil
	}
	if s.n >= MaxRequests {
		return fmt.Errorf("more than %d requests: compare a shorter span", MaxRequests)
	}
	s.add(req)
	return nil
}

func (s *Samples) add(req Request) {
	s.n++
	if _, ok := s.Requests[req.Arm]; !ok {
		s.Order = append(s.Order, req.Arm)
	}
	s.Requests[req.Arm]++
	if t := req.Time; !t.IsZero() {
		if f, ok := s.First[req.Arm]; !ok || t.Before(f) {
			s.First[req.Arm] = t
		}
		if t.After(s.Last[req.Arm]) {
			s.Last[req.Arm] = t
		}
	}
	if req.Failed {
		s.Failed[req.Arm]++
		return
	}
	if s.Served[req.Arm] == nil {
		s.Served[req.Arm] = map[string]int{}
	}
	s.Served[req.Arm][req.Stratum.String()]++
	byMetric := s.Values[req.Arm]
	if byMetric == nil {
		byMetric = map[string]map[Stratum][]float64{}
		s.Values[req.Arm] = byMetric
	}
	for m, v := range req.Values {
		if byMetric[m] == nil {
			byMetric[m] = map[Stratum][]float64{}
		}
		byMetric[m][req.Stratum] = append(byMetric[m][req.Stratum], v)
	}
}

// Arms is the arms read, in order.
func (s *Samples) Arms() []string { return slices.Sorted(maps.Keys(s.Requests)) }
