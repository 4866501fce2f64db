package emulator

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/big"
	"strconv"
	"strings"
)

// LaxBool is a bool request field as vLLM reads it: its request models
// are pydantic models validated in lax mode (pydantic-core's
// validate_bool), which take
//
//   - true and false;
//   - an int equal to 0 or 1 (Python's json makes an int of a number
//     without fraction or exponent, of any size);
//   - a float with no fraction equal to 0 or 1 (0.0, -0.0, 1e0, and
//     1e-400, which underflows to 0.0);
//   - a string equal to "0" or "1", or, ignoring ASCII case only, to one of
//     f, n, no, off, false or t, y, on, yes, true.
//
// null leaves the field unset (the fields are Optional). Anything else is
// refused. The sidecar's tests hold its reading of requests to this one.
type LaxBool bool

var errNotBool = errors.New("input should be a valid boolean")

func (b *LaxBool) UnmarshalJSON(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return err
	}
	if v == nil {
		return nil
	}
	value, ok := pydanticBool(v)
	if !ok {
		return errNotBool
	}
	*b = LaxBool(value)
	return nil
}

// pydanticBool reads a decoded JSON value as pydantic's lax bool.
func pydanticBool(v any) (value, ok bool) {
	switch v := v.(type) {
	case bool:
		return v, true
	case json.Number:
		s := string(v)
		if !strings.ContainsAny(s, ".eE") { // an int
			i, _ := new(big.Int).SetString(s, 10)
			if i.IsInt64() && (i.Int64() == 0 || i.Int64() == 1) {
				return i.Int64() == 1, true
			}
			return false, false
		}
		f, err := strconv.ParseFloat(s, 64) // rounds as Python's float does
		if err != nil || (f != 0 && f != 1) {
			return false, false
		}
		return f == 1, true
	case string:
		if v == "0" || v == "1" {
			return v == "1", true
		}
		folded := []byte(v)
		for i, c := range folded {
			if 'A' <= c && c <= 'Z' {
				folded[i] = c + 'a' - 'A'
			}
		}
		value, ok = boolWords[string(folded)]
		return value, ok
	}
	return false, false
}

var boolWords = map[string]bool{
	"f": false, "n": false, "no": false, "off": false, "false": false,
	"t": true, "y": true, "on": true, "yes": true, "true": true,
}
