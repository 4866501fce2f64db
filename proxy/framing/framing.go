package framing

import "bytes"

// Problem is what is wrong with a header block: the status and the
// OpenAI-style error code a request with it gets, and why.
type Problem struct {
	Status        int
	Code, Message string
}

func problem(why string) *Problem {
	return &Problem{Status: 400, Code: "bad_request", Message: why}
}

// Check reads a raw header block for what says where the body ends:
// exactly one way of saying it, and names that parse one way only. It
// returns nil for a block every parser reads alike.
func Check(raw []byte) *Problem {
	lengths, codings := 0, 0
	chunkedLast, otherCoding := false, false
	for line := range bytes.Lines(raw) {
		line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte{'\n'}), []byte{'\r'})
		if len(line) == 0 {
			continue
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || !IsToken(line[:colon]) {
			// A name with a space (or a folded line) is read differently by
			// different parsers: RFC 9112 section 5.1 says refuse it.
			return problem("a header field name is malformed")
		}
		name := line[:colon]
		switch {
		case len(name) == len("Content-Length") && bytes.EqualFold(name, []byte("Content-Length")):
			lengths++
		case len(name) == len("Transfer-Encoding") && bytes.EqualFold(name, []byte("Transfer-Encoding")):
			codings++
			chunkedLast, otherCoding = readCodings(line[colon+1:], chunkedLast, otherCoding)
		}
	}
	switch {
	case codings > 0 && lengths > 0:
		return problem("the request has both Content-Length and Transfer-Encoding")
	case lengths > 1:
		return problem("the request has more than one Content-Length")
	case codings > 0 && otherCoding:
		return &Problem{Status: 501, Code: "unsupported_transfer_coding", Message: "the only transfer coding served is chunked"}
	case codings > 0 && !chunkedLast:
		// Transfer-Encoding: identity, which fasthttp reads as no body at
		// all: the body would then be read as the next request.
		return problem("Transfer-Encoding must end with chunked")
	}
	return nil
}

// readCodings reads one Transfer-Encoding value on top of those before it:
// whether chunked is now the last coding, and whether any coding other
// than chunked (and the no-op identity) has appeared.
func readCodings(value []byte, chunkedLast, otherCoding bool) (bool, bool) {
	for coding := range bytes.SplitSeq(value, []byte{','}) {
		coding = bytes.TrimSpace(coding)
		if len(coding) == 0 {
			continue
		}
		chunked := bytes.EqualFold(coding, []byte("chunked"))
		if chunkedLast || !chunked {
			// Something after chunked, or a coding other than it.
			otherCoding = otherCoding || !bytes.EqualFold(coding, []byte("identity"))
		}
		chunkedLast = chunked
	}
	return chunkedLast, otherCoding
}

// IsToken tells whether b is an RFC 9110 token (a valid field name).
func IsToken(b []byte) bool {
	for _, c := range b {
		if !tokenChars[c] {
			return false
		}
	}
	return len(b) > 0
}

var tokenChars = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()
