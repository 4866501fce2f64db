package grafana

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "write timing-sidecar.json from the code")

const file = "timing-sidecar.json"

// TestDashboardFileIsGenerated keeps timing-sidecar.json what Dashboard
// builds.
func TestDashboardFileIsGenerated(t *testing.T) {
	d, err := Dashboard()
	if err != nil {
		t.Fatal(err)
	}
	want, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, '\n')
	if *update {
		if err := os.WriteFile(file, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from what the code builds: run go test ./deploy/grafana -update", file)
	}
}

func TestEveryPanelQueriesTheSidecar(t *testing.T) {
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	exprs, err := Expressions(raw)
	if err != nil {
		t.Fatal(err)
	}
	if len(exprs) < 28 {
		t.Fatalf("only %d expressions", len(exprs))
	}
	for _, e := range exprs {
		if !strings.Contains(e, "timing_sidecar_") {
			t.Errorf("expression reads no sidecar series: %s", e)
		}
		if strings.Count(e, "(") != strings.Count(e, ")") || strings.Count(e, "{") != strings.Count(e, "}") {
			t.Errorf("unbalanced: %s", e)
		}
	}
}
