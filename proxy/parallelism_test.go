package proxy

import "testing"

func TestParallelism(t *testing.T) {
	for _, tc := range []struct {
		name          string
		env           string
		current, cpus int
		request       float64
		want          int
		source        string
	}{
		{"the user's GOMAXPROCS", "64", 64, 128, 4, 64, ParallelismEnv},
		{"a CPU limit, as Go read it", "", 3, 128, 1, 3, ParallelismCPULimit},
		{"a request of 100m: one core", "", 128, 128, 0.1, 1, ParallelismCPURequest},
		{"a request of 2.5 cores: three", "", 128, 128, 2.5, 3, ParallelismCPURequest},
		{"a request of exactly 2: two", "", 128, 128, 2, 2, ParallelismCPURequest},
		{"a request over the machine", "", 8, 8, 16, 8, ParallelismCPURequest},
		{"nothing: the default", "", 128, 128, 0, DefaultParallelism, ParallelismDefault},
		{"nothing on a one-core machine", "", 1, 1, 0, 1, ParallelismDefault},
	} {
		n, source := parallelism(tc.env, tc.current, tc.cpus, tc.request)
		if n != tc.want || source != tc.source {
			t.Errorf("%s: %d from %s, want %d from %s", tc.name, n, source, tc.want, tc.source)
		}
	}
}

func TestParseCPU(t *testing.T) {
	for in, want := range map[string]float64{"": 0, "2": 2, "1.5": 1.5, "500m": 0.5, "100m": 0.1, "0": 0} {
		if got, err := ParseCPU(in); err != nil || got != want {
			t.Errorf("%q: %v %v, want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"-1", "two", "1Gi", "m", "NaN", "Inf"} {
		if _, err := ParseCPU(in); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}
