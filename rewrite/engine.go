package rewrite

import (
	"bytes"
	"math"
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/timing-sidecar/timing-sidecar/timing"
)

// EngineTimingOf reads an engine's own timing report from a response object
// (a non-streaming body, or the data of the event the metrics go into):
//
//   - vLLM with --enable-per-request-metrics, asked with include_metrics:
//     "metrics" with our field names already (time_to_first_token_ms from
//     scheduling, queue_time_ms, generation_time_ms, mean_itl_ms,
//     tokens_per_second); its total is queue + TTFT + generation.
//   - llama.cpp's server: "timings" with prompt_ms (prompt processing,
//     read as the time to first token), predicted_ms (generation),
//     predicted_per_token_ms (mean ITL) and predicted_per_second; it
//     reports no queue time; its total is prompt + predicted.
//
// Reported is false when obj carries neither.
func EngineTimingOf(obj []byte) timing.EngineTiming {
	s := view(obj)
	m := gjson.Get(s, "metrics")
	if m.IsObject() {
		return engineTiming(m, gjson.Result{})
	}
	return engineTiming(m, gjson.Get(s, "timings"))
}

// engineTiming reads the engine's timing report from the first "metrics"
// (m) and "timings" (t) members of a response object; vLLM's, when m is
// an object, wins.
func engineTiming(m, t gjson.Result) timing.EngineTiming {
	var e timing.EngineTiming
	if m.IsObject() {
		// vLLM's object: its timing fields, and, from 0.28, its
		// speculative decoding statistics, which may come alone
		// (--per-request-spec-decode-metrics without timing): then the
		// engine reported no timing.
		q, t, g := m.Get("queue_time_ms"), m.Get("time_to_first_token_ms"), m.Get("generation_time_ms")
		itl, tps := m.Get("mean_itl_ms"), m.Get("tokens_per_second")
		e = timing.EngineTiming{Source: "vllm", InMetrics: true,
			Reported:         q.Exists() || t.Exists() || g.Exists() || itl.Exists() || tps.Exists(),
			QueueTime:        number(q),
			TimeToFirstToken: number(t),
			GenerationTime:   number(g),
			MeanITL:          number(itl),
			TokensPerSecond:  number(tps),
		}
		if e.QueueTime.Set && e.TimeToFirstToken.Set && e.GenerationTime.Set {
			e.Total = timing.Number{Value: e.QueueTime.Value + e.TimeToFirstToken.Value + e.GenerationTime.Value, Set: true}
		}
		if sd := m.Get("speculative_decoding"); sd.IsObject() {
			e.AcceptanceLength = number(sd.Get("mean_acceptance_length"))
			e.AcceptanceRate = number(sd.Get("draft_acceptance_rate"))
		}
		return e
	}
	if t.IsObject() {
		e = timing.EngineTiming{Reported: true, Source: "llama.cpp",
			TimeToFirstToken: number(t.Get("prompt_ms")),
			GenerationTime:   number(t.Get("predicted_ms")),
			MeanITL:          number(t.Get("predicted_per_token_ms")),
			TokensPerSecond:  number(t.Get("predicted_per_second")),
		}
		if e.TimeToFirstToken.Set && e.GenerationTime.Set {
			e.Total = timing.Number{Value: e.TimeToFirstToken.Value + e.GenerationTime.Value, Set: true}
		}
	}
	return e
}

// sglangTiming reads SGLang's meta_info, which its OpenAI server puts on
// each choice of a non-streaming answer asked with "return_meta_info":
// true (never in a stream). Its durations are seconds:
//
//	e2e_latency                    total_ms (the request's whole time in the server)
//	queue_time                     queue_time_ms (waiting queue to the forward pass, --enable-metrics)
//	prefill_finished_time −
//	  forward_entry_time           time_to_first_token_ms (scheduled to the first token)
//	inference_time                 inference_time_ms (scheduled to finished)
//	inference_time − that TTFT     generation_time_ms
//
// decode_throughput is not vLLM's tokens_per_second (it leaves the
// prefill out), so it is left out, as is any mean ITL.
func sglangTiming(meta gjson.Result) timing.EngineTiming {
	sec := func(v gjson.Result) timing.Number {
		n := number(v)
		n.Value *= 1000
		return n
	}
	e := timing.EngineTiming{Source: "sglang",
		Total:         sec(meta.Get("e2e_latency")),
		QueueTime:     sec(meta.Get("queue_time")),
		InferenceTime: sec(meta.Get("inference_time")),
	}
	entry, prefilled := number(meta.Get("forward_entry_time")), number(meta.Get("prefill_finished_time"))
	if entry.Set && prefilled.Set && prefilled.Value >= entry.Value {
		e.TimeToFirstToken = timing.Number{Value: (prefilled.Value - entry.Value) * 1000, Set: true}
		if i := e.InferenceTime; i.Set && i.Value >= e.TimeToFirstToken.Value {
			e.GenerationTime = timing.Number{Value: i.Value - e.TimeToFirstToken.Value, Set: true}
		}
	}
	e.Reported = e.Total.Set || e.QueueTime.Set || e.InferenceTime.Set || e.TimeToFirstToken.Set
	return e
}

// number reads a non-negative, finite JSON number; anything else is
// unknown. gjson reads 1e999, valid JSON, as +Inf (and NAN, in a body that
// is not JSON, as NaN), which no JSON encoding can carry.
func number(v gjson.Result) timing.Number {
	if v.Type != gjson.Number || !(v.Num >= 0) || math.IsInf(v.Num, 1) {
		return timing.Number{}
	}
	return timing.Number{Value: v.Num, Set: true}
}

// EngineHeaderPrefix begins the name of every engine timing header read
// by EngineHeader, compared ignoring case.
const EngineHeaderPrefix = "x-vllm-"

// EngineHeader reads one response header of an engine that reports its
// timing in headers (vLLM's proposed request stats headers, on
// non-streaming responses: milliseconds, two decimals) into e, and its
// cached prompt tokens into cached. Each maps to the body's name where
// it means the same:
//
//	x-vllm-queue-time             queue_time_ms (queued to scheduled)
//	x-vllm-prefill-time           time_to_first_token_ms (scheduled to first token, as the body's)
//	x-vllm-decode-time            generation_time_ms (first to last token)
//	x-vllm-time-per-output-token  mean_itl_ms
//	x-vllm-inference-time         inference_time_ms (scheduled to last token)
//	x-vllm-total-time             total_ms (arrival in the engine's server to the end)
//	x-vllm-cached-tokens          the cached prompt tokens, when the usage lacks them
//
// x-vllm-prompt-tokens and -completion-tokens are not read: the body's
// usage, always there, is the count. A value that is not a non-negative
// number is unknown. Names are matched ignoring case; other names are
// left alone.
func EngineHeader(e *timing.EngineTiming, cached *timing.Count, name, value []byte) {
	if len(name) <= len(EngineHeaderPrefix) || !bytes.EqualFold(name[:len(EngineHeaderPrefix)], []byte(EngineHeaderPrefix)) {
		return
	}
	var dst *timing.Number
	switch rest := name[len(EngineHeaderPrefix):]; {
	case bytes.EqualFold(rest, []byte("queue-time")):
		dst = &e.QueueTime
	case bytes.EqualFold(rest, []byte("prefill-time")):
		dst = &e.TimeToFirstToken
	case bytes.EqualFold(rest, []byte("decode-time")):
		dst = &e.GenerationTime
	case bytes.EqualFold(rest, []byte("time-per-output-token")):
		dst = &e.MeanITL
	case bytes.EqualFold(rest, []byte("inference-time")):
		dst = &e.InferenceTime
	case bytes.EqualFold(rest, []byte("total-time")):
		dst = &e.Total
	case bytes.EqualFold(rest, []byte("cached-tokens")):
		if n, err := strconv.ParseInt(string(value), 10, 64); err == nil && n >= 0 {
			*cached = timing.Count{Value: n, Set: true}
		}
		return
	default:
		return
	}
	v, err := strconv.ParseFloat(string(bytes.TrimSpace(value)), 64)
	if err != nil || !(v >= 0) || math.IsInf(v, 1) {
		return
	}
	*dst = timing.Number{Value: v, Set: true}
	e.Reported, e.Source = true, "vllm"
}

// TGIHeaders reads the timing headers Hugging Face's TGI puts on its
// non-streaming answers (router/src/server.rs: whole milliseconds). Their
// names are generic, so they count only beside TGI's own x-compute-type:
//
//	x-queue-time      queue_time_ms (queued to the batch's start)
//	x-inference-time  inference_time_ms (start to the last token)
//	x-total-time      total_ms (arrival in the router to the end, validation included)
//
// x-time-per-token is not vLLM's mean_itl_ms (it divides the inference
// time, prefill included, by the tokens), so it is left out.
type TGIHeaders struct {
	timing timing.EngineTiming
	tgi    bool
}

// Header reads one response header.
func (t *TGIHeaders) Header(name, value []byte) {
	var dst *timing.Number
	switch {
	case bytes.EqualFold(name, []byte("x-compute-type")):
		t.tgi = true
		return
	case bytes.EqualFold(name, []byte("x-queue-time")):
		dst = &t.timing.QueueTime
	case bytes.EqualFold(name, []byte("x-inference-time")):
		dst = &t.timing.InferenceTime
	case bytes.EqualFold(name, []byte("x-total-time")):
		dst = &t.timing.Total
	default:
		return
	}
	v, err := strconv.ParseFloat(string(bytes.TrimSpace(value)), 64)
	if err != nil || !(v >= 0) || math.IsInf(v, 1) {
		return
	}
	*dst = timing.Number{Value: v, Set: true}
	t.timing.Reported = true
}

// Timing is the engine's timing the headers reported, ok only for TGI's.
func (t *TGIHeaders) Timing() (timing.EngineTiming, bool) {
	if !t.tgi || !t.timing.Reported {
		return timing.EngineTiming{}, false
	}
	e := t.timing
	e.Source = "tgi"
	return e, true
}
