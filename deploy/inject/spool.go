package inject

import (
	"fmt"
	"path"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/kustomize/kyaml/yaml"

	"github.com/timing-sidecar/timing-sidecar/telemetry/spool"
)

// spoolVolume is the pod's volume that holds the sidecar's usage records'
// spool, mounted at spoolPath (sidecar.yaml, with
// TIMING_SIDECAR_USAGE_SPOOL_DIR): an emptyDir, which outlives a restart
// of the container (an OOM kill) and lives as long as the pod.
const (
	spoolVolume = "timing-sidecar-spool"
	spoolPath   = "/var/spool/timing-sidecar"
)

// spoolMarginMi is the least the emptyDir's sizeLimit adds to the spool's
// bound, in MiB; it adds a quarter of the bound where that is more. The
// kubelet evicts a pod whose emptyDir holds more than its sizeLimit, and
// the spool passes its bound by up to 4 KiB per request in flight (an
// end's room held back) and by the ends it writes at start for the
// requests the last process lost: the margin covers thousands of each.
const spoolMarginMi = 64

// spoolBound is the spool's bound the sidecar gets, in bytes: its
// TIMING_SIDECAR_USAGE_SPOOL_MAX_SIZE, read as its flag reads it (Go's
// integer syntax), else its default.
func spoolBound(opts *Options) (int64, error) {
	bound := int64(spool.DefaultMaxSize)
	for _, v := range opts.Env {
		if v.Name != "TIMING_SIDECAR_USAGE_SPOOL_MAX_SIZE" {
			continue
		}
		n, err := strconv.ParseInt(v.Value, 0, 64)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("usage-spool-max-size %q is not a positive number of bytes", v.Value)
		}
		bound = n
	}
	return bound, nil
}

// spoolSizeLimitMi is the sizeLimit, in MiB, of an emptyDir that holds a
// spool bounded at bound bytes: the bound in whole MiB, and spoolMarginMi
// or a quarter of it, whichever is more.
func spoolSizeLimitMi(bound int64) int64 {
	mi := bound >> 20
	if bound&(1<<20-1) != 0 {
		mi++
	}
	return mi + max((mi+3)/4, spoolMarginMi)
}

// spoolDirProblem refuses a usage-spool-dir off the spool's volume: the
// sidecar's root filesystem is read-only. Empty turns the spool off.
func spoolDirProblem(dir string) error {
	if dir == "" || path.IsAbs(dir) && (path.Clean(dir) == spoolPath || strings.HasPrefix(path.Clean(dir), spoolPath+"/")) {
		return nil
	}
	return fmt.Errorf("usage-spool-dir %q is not under %s, where the volume %s is mounted: the sidecar's root filesystem is read-only (a volume of that name in the pod chooses what holds the spool)", dir, spoolPath, spoolVolume)
}

// planSpool decides the pod's spool volume: nil when the pod has one of
// that name, kept as it is (a PVC, a larger emptyDir) if the sidecar can
// keep its spool there; else an emptyDir sized for the spool's bound.
func planSpool(ps *podSpec, opts *Options) (*yaml.RNode, error) {
	bound, err := spoolBound(opts)
	if err != nil {
		return nil, err
	}
	limitMi := spoolSizeLimitMi(bound)
	own, err := ps.node.Pipe(yaml.Lookup("volumes", "[name="+spoolVolume+"]"))
	if err != nil {
		return nil, err
	}
	if own != nil {
		return nil, ownSpoolProblem(own, limitMi, ps.knative)
	}
	return yaml.Parse(fmt.Sprintf("name: %s\nemptyDir:\n  sizeLimit: %dMi # the usage spool's bound and a margin\n", spoolVolume, limitMi))
}

// readOnlyVolumes are the kinds of volume the kubelet mounts read-only
// whatever the mount says: the API's data and images.
var readOnlyVolumes = []string{"secret", "configMap", "downwardAPI", "projected", "image"}

// knativeWritable are the kinds of volume Knative lets a container mount
// writable (knative/serving pkg/apis/serving/k8s_validation.go,
// validateVolumeMounts: any other mount must be readOnly).
var knativeWritable = []string{"emptyDir", "persistentVolumeClaim", "ephemeral"}

// ownSpoolProblem says why the pod's own spool volume cannot hold the
// spool: mounted read-only, in memory (files in a memory-backed emptyDir
// count against the sidecar's memory limit), or an emptyDir whose
// sizeLimit the kubelet would evict the pod at before the spool's bound.
func ownSpoolProblem(v *yaml.RNode, limitMi int64, knative bool) error {
	for _, kind := range readOnlyVolumes {
		if v.Field(kind) != nil {
			return fmt.Errorf("the pod's volume %s, where the sidecar keeps its usage spool, is a %s volume, which the kubelet mounts read-only: make it an emptyDir or a persistentVolumeClaim, or remove it for inject's", spoolVolume, kind)
		}
	}
	writable := false
	for _, kind := range knativeWritable {
		writable = writable || v.Field(kind) != nil
	}
	if knative && !writable {
		return fmt.Errorf("the pod's volume %s, where the sidecar keeps its usage spool, is neither an emptyDir nor a persistentVolumeClaim nor an ephemeral volume, the ones Knative mounts writable", spoolVolume)
	}
	if v.Field("emptyDir") == nil {
		return nil
	}
	if scalar(v, "emptyDir", "medium") == "Memory" {
		return fmt.Errorf("the pod's volume %s, where the sidecar keeps its usage spool, is in memory, counted against the sidecar's memory limit: drop medium: Memory", spoolVolume)
	}
	if s := scalar(v, "emptyDir", "sizeLimit"); s != "" {
		if q, err := resource.ParseQuantity(s); err == nil && q.Value() < limitMi<<20 {
			return fmt.Errorf("the pod's volume %s has sizeLimit %s, and the kubelet evicts the pod past it: the usage spool needs %dMi (its bound and a margin); raise it, or lower usage-spool-max-size", spoolVolume, s, limitMi)
		}
	}
	return nil
}

// addSpool gives the pod its spool volume.
func addSpool(pod, volume *yaml.RNode) error {
	volumes, err := sequenceField(pod, "volumes")
	if err != nil {
		return err
	}
	return volumes.PipeE(yaml.Append(volume.YNode()))
}
