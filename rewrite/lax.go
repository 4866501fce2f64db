package rewrite

import (
	"strconv"

	"github.com/tidwall/gjson"
)

// The engine's reading of a boolean field. vLLM (and every engine served
// by FastAPI) decodes a request with Python's json and validates it with
// pydantic in lax mode, which takes more than true and false for a bool:
//
//   - true, false;
//   - a number equal to 0 or 1: an integer (0, -0, 1) or a float with no
//     fraction (0.0, -0.0, 1e0, 1e-400, which underflows to 0);
//   - a string, once its escapes are decoded, equal to "0" or "1" or,
//     ignoring ASCII case only, to one of f, n, no, off, false (false) or
//     t, y, on, yes, true (true).
//
// Anything else (2, 0.5, "", " true", "yeſ", an array) is refused with a
// 422. The sidecar reads a bool field with laxBool, so that it reads the
// value the engine reads and refuses what the engine refuses.

// maxBoolString is the longest raw JSON string that can hold one of the
// words: "false" with every letter escaped (\u0066...) and its quotes. A
// longer string is none of them, whatever it decodes to.
const maxBoolString = 5*len(`\u0000`) + 2

// laxBool reads the raw JSON value raw (valid, not null) as a pydantic
// bool field in lax mode; ok is false for a value the engine refuses.
func laxBool(raw string) (value, ok bool) {
	switch raw[0] {
	case 't':
		return true, true
	case 'f':
		return false, true
	case '"':
		if len(raw) > maxBoolString {
			return false, false
		}
		s := raw[1 : len(raw)-1]
		for i := 0; i < len(s); i++ {
			if s[i] == '\\' {
				s = gjson.Parse(raw).Str // escaped: rare, and at most 32 bytes
				break
			}
		}
		return boolWord(s)
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return boolNumber(raw)
	}
	return false, false
}

// boolWord is pydantic's reading of a string as a bool.
func boolWord(s string) (value, ok bool) {
	switch s {
	case "0":
		return false, true
	case "1":
		return true, true
	}
	if len(s) > len("false") {
		return false, false
	}
	var lower [5]byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A' // ASCII only, as Rust's eq_ignore_ascii_case
		}
		lower[i] = c
	}
	switch string(lower[:len(s)]) {
	case "f", "n", "no", "off", "false":
		return false, true
	case "t", "y", "on", "yes", "true":
		return true, true
	}
	return false, false
}

// boolNumber is pydantic's reading of a JSON number as a bool. Python's
// json makes an int of a number without fraction or exponent, and a float
// (correctly rounded, as strconv's) of any other.
func boolNumber(raw string) (value, ok bool) {
	switch raw {
	case "0", "-0":
		return false, true
	case "1":
		return true, true
	}
	for i := 0; i < len(raw); i++ {
		if c := raw[i]; c == '.' || c == 'e' || c == 'E' {
			f, err := strconv.ParseFloat(raw, 64)
			switch {
			case err != nil: // out of range: infinite, refused
				return false, false
			case f == 0:
				return false, true
			case f == 1:
				return true, true
			}
			return false, false
		}
	}
	return false, false // an integer other than 0 or 1
}

// optionalBool reads an Optional[bool] field as the engine does: null is
// None, which the engine treats as false.
func optionalBool(raw string) (value, ok bool) {
	if raw[0] == 'n' {
		return false, true
	}
	return laxBool(raw)
}
