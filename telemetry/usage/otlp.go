package usage

import (
	"reflect"
	"regexp"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// otlpOutcome reads the error of the OTLP logs exporter (otlploghttp or
// otlploggrpc, with their retries off) as a Send's outcome (outcome.go):
//   - a partial success comes back as an error of the exporter's internal
//     type PartialSuccess (RejectedItems, ErrorMessage), read here by
//     reflection since it cannot be imported: a *Partial;
//   - over gRPC, a status whose code the OTLP specification calls not
//     retryable (anything but CANCELLED, DEADLINE_EXCEEDED,
//     RESOURCE_EXHAUSTED, ABORTED, OUT_OF_RANGE, UNAVAILABLE, DATA_LOSS):
//     a *Rejected;
//   - over HTTP, "failed to send logs to URL: STATUS (body: …)", which
//     the exporter returns for the statuses OTLP calls not retryable
//     (all but 429, 502, 503, 504): a *Rejected.
//
// Everything else is retried. TestOTLPOutcomesFromTheRealExporters holds
// these readings to the exporters this module builds with.
func otlpOutcome(err error) error {
	if err == nil {
		return nil
	}
	if p, ok := partialSuccess(err); ok {
		return p
	}
	if st, ok := status.FromError(err); ok {
		switch st.Code() {
		case codes.OK:
			return nil
		case codes.Canceled, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted,
			codes.OutOfRange, codes.Unavailable, codes.DataLoss:
			return err
		}
		return &Rejected{Status: st.Code().String() + ": " + st.Message()}
	}
	if m := httpRefusal.FindStringSubmatch(err.Error()); m != nil {
		return &Rejected{Status: strings.TrimSpace(m[1]), TooLarge: strings.HasPrefix(m[1], "413")}
	}
	return err
}

// httpRefusal is otlploghttp's error for a status OTLP calls not
// retryable.
var httpRefusal = regexp.MustCompile(`failed to send logs to \S+: (\d{3}[^(]*)`)

// partialSuccess finds the exporter's partial success in err's tree.
func partialSuccess(err error) (*Partial, bool) {
	var found *Partial
	walkErrors(err, func(e error) {
		v := reflect.ValueOf(e)
		if v.Kind() != reflect.Struct || v.Type().Name() != "PartialSuccess" {
			return
		}
		n, msg := v.FieldByName("RejectedItems"), v.FieldByName("ErrorMessage")
		if n.Kind() == reflect.Int64 && msg.Kind() == reflect.String {
			found = &Partial{Rejected: int(n.Int()), Message: msg.String()}
		}
	})
	return found, found != nil
}

// walkErrors calls each for err and every error it wraps.
func walkErrors(err error, each func(error)) {
	if err == nil {
		return
	}
	each(err)
	switch u := err.(type) { //nolint:errorlint // walking the tree by hand
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			walkErrors(e, each)
		}
	case interface{ Unwrap() error }:
		walkErrors(u.Unwrap(), each)
	}
}
