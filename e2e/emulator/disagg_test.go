package emulator

import (
	"context"
	"encoding/json"
	"testing"
	"time"
)

// TestDisaggregatedLegs: a prefill leg answers one token with the KV's
// whereabouts, as vLLM's NIXL connector; a decode leg waits for the KV
// pull, not a prefill, before its first token.
func TestDisaggregatedLegs(t *testing.T) {
	s := start(t, Config{Timing: Timing{TTFT: 10 * time.Millisecond, KVTransfer: 60 * time.Millisecond, ITL: time.Millisecond, TokensPerEvent: 1, OutputTokens: 4}})
	_, body := call(t, s, "/v1/chat/completions", `{"model":"m","messages":[],"max_tokens":1,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false}}`)
	var prefill struct {
		KV struct {
			DoRemotePrefill bool  `json:"do_remote_prefill"`
			Blocks          []int `json:"remote_block_ids"`
		} `json:"kv_transfer_params"`
		Usage struct {
			Completion int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(body[0]), &prefill); err != nil || !prefill.KV.DoRemotePrefill || len(prefill.KV.Blocks) == 0 || prefill.Usage.Completion != 1 {
		t.Fatalf("prefill answer %s (%v)", body[0], err)
	}
	if rec, _ := s.Last(context.Background()); rec.HeadersSent.Sub(rec.Received) < 10*time.Millisecond {
		t.Errorf("the prefill leg answered %v after the request, before its TTFT", rec.HeadersSent.Sub(rec.Received))
	}
	call(t, s, "/v1/chat/completions", `{"model":"m","messages":[],"stream":true,"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1,2,3]}}`)
	rec, _ := s.Last(context.Background())
	// The KV pull is longer than a prefill here: a first token after it
	// is the pull's.
	if wait := rec.FirstToken.Sub(rec.HeadersSent); wait < 60*time.Millisecond {
		t.Errorf("the decode leg's first token %v after its headers, want after the 60 ms KV pull", wait)
	}
}

// TestLateHeaders: with late headers a stream's headers wait for its
// first token, and the client gets both at once.
func TestLateHeaders(t *testing.T) {
	s := start(t, Config{Timing: Timing{TTFT: 40 * time.Millisecond, ITL: time.Millisecond, TokensPerEvent: 1, OutputTokens: 3}, LateHeaders: true})
	call(t, s, "/v1/chat/completions", `{"model":"m","messages":[],"stream":true}`)
	rec, _ := s.Last(context.Background())
	if rec.HeadersSent.Sub(rec.Received) < 40*time.Millisecond || rec.FirstToken.Before(rec.HeadersSent) {
		t.Errorf("headers %v after the request, first token %v after them", rec.HeadersSent.Sub(rec.Received), rec.FirstToken.Sub(rec.HeadersSent))
	}
}
