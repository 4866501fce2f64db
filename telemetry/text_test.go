package telemetry

import (
	"bytes"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// writeText writes one metric family in the text exposition format.
func writeText(buf *bytes.Buffer, mf *dto.MetricFamily) {
	expfmt.MetricFamilyToText(buf, mf) //nolint:errcheck
}
