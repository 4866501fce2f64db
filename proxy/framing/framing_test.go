package framing

import "testing"

func TestCheck(t *testing.T) {
	for _, tt := range []struct {
		block string
		code  string // "" for none
	}{
		{"Host: x\r\nContent-Length: 3\r\n", ""},
		{"Transfer-Encoding: gzip, chunked\r\n", "unsupported_transfer_coding"},
		{"Transfer-Encoding: chunked\r\n", ""},
		{"Transfer-Encoding: identity, chunked\r\n", ""},
		{"Transfer-Encoding: chunked, identity\r\n", "bad_request"},
		{"Transfer-Encoding: identity\r\n", "bad_request"},
		{"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n", "bad_request"},
		{"Content-Length: 3\r\nContent-Length: 3\r\n", "bad_request"},
		{"Content Length: 3\r\n", "bad_request"},
		{" folded\r\n", "bad_request"},
	} {
		got := ""
		if pr := Check([]byte(tt.block)); pr != nil {
			got = pr.Code
		}
		if got != tt.code {
			t.Errorf("%q: %q, want %q", tt.block, got, tt.code)
		}
	}
}
