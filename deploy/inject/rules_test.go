package inject

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/kustomize/kyaml/kio"
	"sigs.k8s.io/kustomize/kyaml/yaml"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/timing-sidecar/timing-sidecar/telemetry/spool"
)

// checkOutput decodes every document inject wrote from in into its
// Kubernetes type, refusing unknown fields, and checks each pod spec with
// the sidecar against the rules of the platform that runs it and against
// the traffic it must carry. A rule the input broke already is the
// input's: only what inject adds is held to it.
func checkOutput(t *testing.T, in, out string, opts Options) {
	t.Helper()
	before := map[int]map[string]bool{} // the input's problems, by pod spec
	inDocs, err := (&kio.ByteReader{Reader: strings.NewReader(in)}).Read()
	if err != nil {
		t.Fatal(err)
	}
	badInput := map[int]bool{}
	n := 0
	for i, doc := range inDocs {
		text, _ := doc.String()
		badInput[i] = strictProblem(doc.GetApiVersion(), doc.GetKind(), text) != nil
		for _, ps := range podSpecsOf(doc) {
			spec := podSpecOf(t, &ps)
			before[n] = map[string]bool{}
			for _, p := range podProblems(spec, ps.knative) {
				before[n][p] = true
			}
			n++
		}
	}
	docs, err := (&kio.ByteReader{Reader: strings.NewReader(out)}).Read()
	if err != nil {
		t.Fatalf("the output does not read back: %v", err)
	}
	maps := configMapsOf(docs)
	n = 0
	for i, doc := range docs {
		text, err := doc.String()
		if err != nil {
			t.Fatal(err)
		}
		if err := strictProblem(doc.GetApiVersion(), doc.GetKind(), text); err != nil && !badInput[i] {
			t.Errorf("not a valid %s: %v\n%s", doc.GetKind(), err, text)
		}
		for _, ps := range podSpecsOf(doc) {
			ps.configMaps = maps
			spec := podSpecOf(t, &ps)
			for _, p := range podProblems(spec, ps.knative) {
				if !before[n][p] {
					t.Error(p)
				}
			}
			n++
			if sidecar := findSidecar(spec); sidecar != nil {
				if p := runAsNonRootProblem(sidecar, imageUser(t)); p != "" {
					t.Error(p)
				}
				for _, p := range spoolProblems(spec, sidecar) {
					t.Error(p)
				}
				checkTraffic(t, &ps, spec, sidecar, opts)
			}
		}
	}
}

// podProblems is every rule of the API server, and of Knative where it
// runs the pod, that spec breaks.
func podProblems(spec corev1.PodSpec, knative bool) []string {
	p := append(apiServerProblems(spec), apiServerVolumeProblems(spec)...)
	if knative {
		p = append(p, knativeProblems(spec)...)
	}
	return p
}

// strictProblem decodes the kinds k8s.io/api has (v1, apps, batch: no
// dot in the group), refusing unknown fields.
func strictProblem(apiVersion, kind, doc string) error {
	if strings.Contains(apiVersion, ".") {
		return nil
	}
	var v any
	switch kind {
	case "Pod":
		v = &corev1.Pod{}
	case "Service":
		v = &corev1.Service{}
	case "Deployment":
		v = &appsv1.Deployment{}
	case "StatefulSet":
		v = &appsv1.StatefulSet{}
	case "DaemonSet":
		v = &appsv1.DaemonSet{}
	case "ReplicaSet":
		v = &appsv1.ReplicaSet{}
	case "Job":
		v = &batchv1.Job{}
	case "CronJob":
		v = &batchv1.CronJob{}
	default:
		return nil
	}
	return sigsyaml.UnmarshalStrict([]byte(doc), v)
}

// podSpecOf decodes a pod spec strictly, as core's PodSpec; a KServe
// runtime's spec has fields of its own beside its containers, which are
// core's Containers.
func podSpecOf(t *testing.T, ps *podSpec) corev1.PodSpec {
	t.Helper()
	text, err := ps.node.String()
	if err != nil {
		t.Fatal(err)
	}
	var spec corev1.PodSpec
	strictErr := sigsyaml.UnmarshalStrict([]byte(text), &spec)
	if strictErr == nil {
		return spec
	}
	if !ps.knative {
		t.Fatalf("not a valid pod spec: %v\n%s", strictErr, text)
	}
	var loose struct {
		Containers []json.RawMessage `json:"containers"`
		Volumes    []json.RawMessage `json:"volumes"`
	}
	if err := sigsyaml.Unmarshal([]byte(text), &loose); err != nil {
		t.Fatal(err)
	}
	spec = corev1.PodSpec{}
	for _, raw := range loose.Containers {
		var c corev1.Container
		if err := sigsyaml.UnmarshalStrict(raw, &c); err != nil {
			t.Fatalf("not a valid container: %v\n%s", err, raw)
		}
		spec.Containers = append(spec.Containers, c)
	}
	for _, raw := range loose.Volumes {
		var v corev1.Volume
		if err := sigsyaml.UnmarshalStrict(raw, &v); err != nil {
			t.Fatalf("not a valid volume: %v\n%s", err, raw)
		}
		spec.Volumes = append(spec.Volumes, v)
	}
	return spec
}

func findSidecar(spec corev1.PodSpec) *corev1.Container {
	for _, list := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range list {
			if list[i].Name == Name {
				return &list[i]
			}
		}
	}
	return nil
}

func allContainers(spec corev1.PodSpec) []corev1.Container {
	return append(slices.Clone(spec.InitContainers), spec.Containers...)
}

// apiServerProblems: the checks the API server makes of a pod's ports
// (kubernetes pkg/apis/core/validation/validation.go: validateContainerPorts
// with apimachinery's IsValidPortName; AccumulateUniqueHostPorts across
// the regular containers), and, held stricter than its warnings
// (pkg/api/pod/warnings.go), a port number and a port name used once in
// the whole pod, so that Services and probes that name a port mean one.
func apiServerProblems(spec corev1.PodSpec) []string {
	var out []string
	numbers, names, hostPorts := map[string]string{}, map[string]string{}, map[string]string{}
	for _, c := range allContainers(spec) {
		for _, p := range c.Ports {
			if p.Name != "" {
				if errs := validation.IsValidPortName(p.Name); len(errs) > 0 {
					out = append(out, fmt.Sprintf("container %s: port name %q: %v", c.Name, p.Name, errs))
				}
				if other, ok := names[p.Name]; ok {
					out = append(out, fmt.Sprintf("port name %q in containers %s and %s", p.Name, other, c.Name))
				}
				names[p.Name] = c.Name
			}
			key := fmt.Sprintf("%d/%s", p.ContainerPort, p.Protocol)
			if other, ok := numbers[key]; ok {
				out = append(out, fmt.Sprintf("containerPort %s in containers %s and %s", key, other, c.Name))
			}
			numbers[key] = c.Name
			if p.HostPort != 0 {
				key := fmt.Sprintf("%s/%s/%d", p.Protocol, p.HostIP, p.HostPort)
				if other, ok := hostPorts[key]; ok {
					out = append(out, fmt.Sprintf("hostPort %s in containers %s and %s", key, other, c.Name))
				}
				hostPorts[key] = c.Name
			}
		}
	}
	return out
}

// apiServerVolumeProblems: the checks the API server makes of a pod's
// volumes (kubernetes pkg/apis/core/validation/validation.go:
// ValidateVolumes, each name a DNS-1123 label used once;
// ValidateVolumeMounts, each mount of each container naming a volume of
// the pod, at a mountPath given and used once in the container).
func apiServerVolumeProblems(spec corev1.PodSpec) []string {
	var out []string
	names := map[string]bool{}
	for _, v := range spec.Volumes {
		if errs := validation.IsDNS1123Label(v.Name); len(errs) > 0 {
			out = append(out, fmt.Sprintf("volume name %q: %v", v.Name, errs))
		}
		if names[v.Name] {
			out = append(out, fmt.Sprintf("two volumes named %q", v.Name))
		}
		names[v.Name] = true
	}
	for _, c := range allContainers(spec) {
		paths := map[string]bool{}
		for _, m := range c.VolumeMounts {
			if !names[m.Name] {
				out = append(out, fmt.Sprintf("container %s mounts %q, no volume of the pod", c.Name, m.Name))
			}
			if m.MountPath == "" {
				out = append(out, fmt.Sprintf("container %s mounts %q with no mountPath", c.Name, m.Name))
			}
			if paths[m.MountPath] {
				out = append(out, fmt.Sprintf("container %s mounts twice at %s", c.Name, m.MountPath))
			}
			paths[m.MountPath] = true
		}
	}
	return out
}

// spoolProblems: the sidecar's usage spool is on a volume it writes (its
// root filesystem is read-only), and an emptyDir there holds the spool's
// bound with inject's margin: the kubelet evicts a pod whose emptyDir
// holds more than its sizeLimit (kubernetes
// pkg/kubelet/eviction/eviction_manager.go, emptyDirLimitEviction;
// https://kubernetes.io/docs/concepts/storage/volumes/#emptydir), and the
// spool passes its bound by a few KiB per request in flight and by the
// records of the requests it finds lost at start.
func spoolProblems(spec corev1.PodSpec, sidecar *corev1.Container) []string {
	env := map[string]string{}
	for _, e := range sidecar.Env {
		env[e.Name] = e.Value
	}
	dir, set := env["TIMING_SIDECAR_USAGE_SPOOL_DIR"]
	switch {
	case !set:
		return []string{"the sidecar has no usage spool"}
	case dir == "":
		return nil // turned off by a setting
	}
	var mount *corev1.VolumeMount
	for i, m := range sidecar.VolumeMounts {
		at := path.Clean(m.MountPath)
		if under := path.Clean(dir); (under == at || strings.HasPrefix(under, at+"/")) && !m.ReadOnly {
			mount = &sidecar.VolumeMounts[i]
		}
	}
	if mount == nil {
		return []string{fmt.Sprintf("the usage spool %s is on no writable mount of the sidecar %v: its root filesystem is read-only", dir, sidecar.VolumeMounts)}
	}
	bound := int64(spool.DefaultMaxSize)
	if v, ok := env["TIMING_SIDECAR_USAGE_SPOOL_MAX_SIZE"]; ok {
		bound, _ = strconv.ParseInt(v, 0, 64)
	}
	for _, v := range spec.Volumes {
		if v.Name != mount.Name || v.EmptyDir == nil {
			continue
		}
		if v.EmptyDir.Medium == corev1.StorageMediumMemory {
			return []string{fmt.Sprintf("the usage spool's volume %s is in memory, counted against the sidecar's memory limit", v.Name)}
		}
		if limit := v.EmptyDir.SizeLimit; limit != nil && (limit.Value() < bound+64<<20 || limit.Value() < bound+bound/4) {
			return []string{fmt.Sprintf("the usage spool's volume %s has sizeLimit %s: the kubelet evicts the pod before the spool reaches its bound %d bytes and a margin (a quarter, at least 64Mi)", v.Name, v.EmptyDir.SizeLimit, bound)}
		}
	}
	return nil
}

// imageUser is the USER of the Dockerfile's final stage.
func imageUser(t *testing.T) string {
	t.Helper()
	f, err := os.Open("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	user := ""
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		switch {
		case len(fields) > 0 && strings.EqualFold(fields[0], "FROM"):
			user = ""
		case len(fields) == 2 && strings.EqualFold(fields[0], "USER"):
			user = fields[1]
		}
	}
	return user
}

// runAsNonRootProblem: the kubelet's rule (kubernetes
// pkg/kubelet/kuberuntime/security_context_others.go, verifyRunAsNonRoot):
// a container with runAsNonRoot and no runAsUser starts only if its
// image's user is a number other than 0 ("container has runAsNonRoot and
// image has non-numeric user ..., cannot verify user is non-root"); a
// runAsUser must not be 0.
func runAsNonRootProblem(c *corev1.Container, imageUser string) string {
	sc := c.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		return ""
	}
	if sc.RunAsUser != nil {
		if *sc.RunAsUser == 0 {
			return c.Name + ": runAsNonRoot with runAsUser 0"
		}
		return ""
	}
	uid, _, _ := strings.Cut(imageUser, ":")
	if n, err := strconv.ParseInt(uid, 10, 64); err != nil || n == 0 {
		return fmt.Sprintf("%s: runAsNonRoot without runAsUser, and the image's USER %q is not a non-zero number: the kubelet refuses to start it", c.Name, imageUser)
	}
	return ""
}

// knativeProblems: Knative Serving's checks of a revision's containers
// with its features at their defaults (knative/serving
// pkg/apis/serving/k8s_validation.go and fieldmask.go):
// validateContainersPorts allows one port in all, validPortNames only
// "", h2c or http1, reservedPorts none of 8008, 8012, 8013, 8022, 9090,
// 9091; validateSidecarContainer refuses any probe on a container without
// the port; ContainerMask has no restartPolicy; EnvVarSourceMask allows
// only configMapKeyRef and secretKeyRef. Volumes: knativeVolumeProblems.
func knativeProblems(spec corev1.PodSpec) []string {
	out := knativeVolumeProblems(spec)
	ports := 0
	for _, c := range allContainers(spec) {
		ports += len(c.Ports)
		for _, p := range c.Ports {
			if p.Name != "" && p.Name != "h2c" && p.Name != "http1" {
				out = append(out, fmt.Sprintf("Knative: container %s: port name %q is not allowed", c.Name, p.Name))
			}
			if slices.Contains(knativeReserved, int(p.ContainerPort)) {
				out = append(out, fmt.Sprintf("Knative: container %s: %d is a reserved port", c.Name, p.ContainerPort))
			}
		}
		if len(c.Ports) == 0 && (c.ReadinessProbe != nil || c.LivenessProbe != nil || c.StartupProbe != nil) {
			out = append(out, fmt.Sprintf("Knative: container %s has probes and no port", c.Name))
		}
		if c.RestartPolicy != nil {
			out = append(out, fmt.Sprintf("Knative: container %s sets restartPolicy", c.Name))
		}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef == nil && e.ValueFrom.SecretKeyRef == nil {
				out = append(out, fmt.Sprintf("Knative: container %s: env %s uses the downward API", c.Name, e.Name))
			}
		}
	}
	if ports > 1 {
		out = append(out, fmt.Sprintf("Knative: %d ports; only a single port is allowed across all containers", ports))
	}
	if len(spec.InitContainers) > 0 {
		out = append(out, "Knative: init containers")
	}
	return out
}

// knativeVolumeProblems: Knative Serving's checks of a revision's volumes
// with its features at their defaults (knative/serving
// pkg/apis/serving/k8s_validation.go): ValidateVolumes wants every volume
// mounted by a container ("volume with name %q not mounted");
// validateVolume and VolumeSourceMask (fieldmask.go) allow only secret,
// configMap, projected and emptyDir sources (kubernetes.podspec-volumes-
// emptydir is Enabled in pkg/apis/config/features.go,
// defaultFeaturesConfig, and config/core/configmaps/features.yaml; PVC,
// hostPath, CSI, ephemeral and image volumes are Disabled);
// validateEmptyDirFields wants medium "" or Memory and a sizeLimit not
// negative; validateVolumeMounts wants a mountPath absolute, not reserved
// (reservedPaths: /, /dev, /dev/log) and once in the container, and a
// mount readOnly unless on an emptyDir, a persistentVolumeClaim or an
// ephemeral volume.
func knativeVolumeProblems(spec corev1.PodSpec) []string {
	var out []string
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
		s := v.VolumeSource
		if s.Secret == nil && s.ConfigMap == nil && s.Projected == nil && s.EmptyDir == nil {
			out = append(out, fmt.Sprintf("Knative: volume %s is of a kind its features leave off", v.Name))
		}
		if d := s.EmptyDir; d != nil && (d.Medium != "" && d.Medium != corev1.StorageMediumMemory || d.SizeLimit != nil && d.SizeLimit.Sign() < 0) {
			out = append(out, fmt.Sprintf("Knative: emptyDir %s: medium %q, sizeLimit %v", v.Name, d.Medium, d.SizeLimit))
		}
	}
	mounted := map[string]bool{}
	for _, c := range allContainers(spec) {
		paths := map[string]bool{}
		for _, m := range c.VolumeMounts {
			mounted[m.Name] = true
			clean := path.Clean(m.MountPath)
			switch {
			case clean == "/" || clean == "/dev" || clean == "/dev/log":
				out = append(out, fmt.Sprintf("Knative: container %s: mountPath %q is a reserved path", c.Name, clean))
			case !path.IsAbs(m.MountPath):
				out = append(out, fmt.Sprintf("Knative: container %s: mountPath %q is not absolute", c.Name, m.MountPath))
			case paths[clean]:
				out = append(out, fmt.Sprintf("Knative: container %s: mountPath %q must be unique", c.Name, m.MountPath))
			}
			paths[clean] = true
			v := volumes[m.Name].VolumeSource
			if v.EmptyDir == nil && v.PersistentVolumeClaim == nil && v.Ephemeral == nil && !m.ReadOnly {
				out = append(out, fmt.Sprintf("Knative: container %s: the mount of %s should be readOnly for this type of volume", c.Name, m.Name))
			}
		}
	}
	for _, v := range spec.Volumes {
		if !mounted[v.Name] {
			out = append(out, fmt.Sprintf("Knative: volume with name %q not mounted", v.Name))
		}
	}
	return out
}

// checkTraffic follows the traffic: the sidecar listens where the engine
// listened, as reachable as the engine was (loopback stays loopback), and
// relays to the port the engine listens on now; the engine's probes test
// the engine; a declared proxy port is the one it listens on.
func checkTraffic(t *testing.T, ps *podSpec, spec corev1.PodSpec, sidecar *corev1.Container, opts Options) {
	t.Helper()
	env := map[string]string{}
	for _, e := range sidecar.Env {
		env[e.Name] = e.Value
	}
	host, p, err := net.SplitHostPort(env["TIMING_SIDECAR_LISTEN"])
	port, perr := strconv.Atoi(p)
	if err != nil || perr != nil {
		t.Fatalf("TIMING_SIDECAR_LISTEN %q", env["TIMING_SIDECAR_LISTEN"])
	}
	m := regexp.MustCompile(`^http://(127\.0\.0\.1|\[::1\]):(\d+)$`).FindStringSubmatch(env["TIMING_SIDECAR_UPSTREAM"])
	if m == nil {
		t.Fatalf("TIMING_SIDECAR_UPSTREAM %q is not the engine on loopback", env["TIMING_SIDECAR_UPSTREAM"])
	}
	upstream, _ := strconv.Atoi(m[2])
	// An engine marked by its port has moved off it: found by name.
	name := opts.EngineContainer
	for _, c := range spec.Containers {
		for _, p := range c.Ports {
			if name == "" && opts.EnginePort > 0 && p.Name == "engine" {
				name = c.Name
			}
		}
	}
	f, err := frontOf(ps, &Options{EngineContainer: name, Placement: opts.Placement})
	if err != nil || f == nil {
		t.Fatalf("no engine beside the sidecar: %v", err)
	}
	enginePort, r, err := f.port(&Options{})
	if err != nil {
		t.Fatal(err)
	}
	if enginePort != upstream {
		t.Errorf("the engine listens on %d (%s), the sidecar relays to %d", enginePort, r.from, upstream)
	}
	if enginePort == port {
		t.Errorf("the engine and the sidecar both listen on %d", port)
	}
	addr, err := f.address()
	if err != nil {
		t.Fatal(err)
	}
	if loopback := host != ""; loopback != (addr.scope == loopbackOnly) {
		t.Errorf("the engine listens on %s (%s), the sidecar on %q", addr.from, scopeName(addr.scope), env["TIMING_SIDECAR_LISTEN"])
	}
	for _, p := range sidecar.Ports {
		if p.Name != adminPortName && int(p.ContainerPort) != port {
			t.Errorf("the sidecar declares port %d and listens on %d", p.ContainerPort, port)
		}
	}
	for _, c := range allContainers(spec) {
		if c.Name != scalar(f.c, "name") {
			continue
		}
		for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
			if p == nil {
				continue
			}
			var port intstr.IntOrString
			switch {
			case p.HTTPGet != nil:
				port = p.HTTPGet.Port
			case p.TCPSocket != nil:
				port = p.TCPSocket.Port
			default:
				continue
			}
			// A number written as a string is a name to the API server,
			// and no name has only digits.
			if port.Type != intstr.Int {
				t.Errorf("the engine's probe's port is the string %q", port.StrVal)
			}
			probed := port.IntValue()
			if probed != enginePort {
				t.Errorf("the engine's probe tests %d, the engine listens on %d", probed, enginePort)
			}
		}
	}
}

func scopeName(s scope) string {
	if s == loopbackOnly {
		return "loopback"
	}
	return "every interface"
}

// yamlString is a node's YAML, for messages.
func yamlString(n *yaml.RNode) string {
	s, _ := n.String()
	return s
}

func strict(t *testing.T, doc string, v any) {
	t.Helper()
	if err := sigsyaml.UnmarshalStrict([]byte(doc), v); err != nil {
		t.Fatalf("not a valid object: %v\n%s", err, doc)
	}
}
