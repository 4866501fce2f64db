package inject

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPublished injects manifests as their projects publish them
// (testdata/published, each naming its source): the output is the golden
// file and obeys every rule checkOutput knows, or the refusal is the one
// in the .refused file.
func TestPublished(t *testing.T) {
	files, err := filepath.Glob("testdata/published/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range files {
		if strings.HasSuffix(file, ".golden.yaml") {
			continue
		}
		name := strings.TrimSuffix(file, ".yaml")
		t.Run(filepath.Base(name), func(t *testing.T) {
			in, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			got, err := injectString(t, string(in), Options{})
			golden, refusal := name+".golden.yaml", name+".refused"
			if err != nil {
				got = err.Error() + "\n"
				golden = refusal
			}
			if *update {
				os.Remove(name + ".golden.yaml")
				os.Remove(refusal)
				os.WriteFile(golden, []byte(got), 0o644)
			}
			want, rerr := os.ReadFile(golden)
			if rerr != nil || string(want) != got {
				t.Errorf("differs from %s (go test ./deploy/inject -update):\n%s", golden, got)
			}
			if err == nil {
				checkOutput(t, string(in), got, Options{})
			}
		})
	}
}
