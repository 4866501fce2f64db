package e2e

import (
	"bufio"
	"debug/elf"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
	"github.com/timing-sidecar/timing-sidecar/proxy"
)

func TestVersion(t *testing.T) {
	out, err := exec.Command(binary, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	want := "timing-sidecar e2e (commit e2e-commit, " + runtime.Version() + ")\n"
	if string(out) != want {
		t.Fatalf("--version printed %q, want %q", out, want)
	}
}

// TestReleaseBinaryIsStatic: the distroless static image has no libc, so
// the binary must not ask for a dynamic loader.
func TestReleaseBinaryIsStatic(t *testing.T) {
	f, err := elf.Open(binary)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("the release binary is dynamically linked")
		}
	}
}

// TestDockerfile keeps the image in line with the build script and the
// binary: no Docker engine is needed to check what it will run.
func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	for _, want := range []string{
		`RUN VERSION="$VERSION" COMMIT="$COMMIT" .ci/build /out/timing-sidecar`,
		"FROM gcr.io/distroless/static:nonroot",
		// distroless's nonroot, by number: the kubelet verifies
		// runAsNonRoot only for a numeric user (deploy/inject's
		// TestPodStarts holds the rule).
		"USER 65532:65532",
		`ENTRYPOINT ["/timing-sidecar"]`,
		"EXPOSE " + strings.TrimPrefix(proxy.DefaultListen, ":") + " " + strings.TrimPrefix(proxy.DefaultAdminListen, ":"),
	} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	ignore, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	for _, needed := range []string{"go.mod", "go.sum", ".ci", "cmd", "proxy"} {
		for _, line := range strings.Split(string(ignore), "\n") {
			if strings.TrimSpace(line) == needed {
				t.Errorf(".dockerignore excludes %s, which the build needs", needed)
			}
		}
	}
}

// TestGracefulShutdown: at SIGTERM the sidecar fails /readyz while it
// still accepts connections, refuses new connections once the drain delay
// is over and not before, a stream in flight completes intact, and the
// process exits 0 once the stream is done.
func TestGracefulShutdown(t *testing.T) {
	// The stream (40 events 50 ms apart) outlasts the drain delay, so it
	// is in flight when the listener closes.
	const drain = time.Second
	engine := startEngine(t, emulator.Config{Timing: emulator.Timing{ITL: 50 * time.Millisecond, OutputTokens: 40}})
	sc := startSidecar(t, []string{"--listen", "127.0.0.1:0", "--upstream", engine.URL(),
		"--drain-delay", drain.String(), "--shutdown-grace", "20s", "--readiness-interval", "20ms"})
	body := `{"model":"m","stream":true,"include_metrics":true,"messages":[{"role":"user","content":"hi"}]}`
	resp, err := http.Post(sc.base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	signalled := time.Now()
	sc.cmd.Process.Signal(syscall.SIGTERM)

	// Readiness fails during the drain delay: once /readyz says 503, a
	// new connection is still accepted. The signal arrives when the
	// scheduler lets it; the delay is the window, and the promise (at
	// once) is the sidecar's, not this test's.
	addr := strings.TrimPrefix(sc.base, "http://")
	for {
		ready, err := http.Get(sc.admin + "/readyz")
		if err != nil {
			t.Fatalf("admin port gone during the drain: %v", err)
		}
		ready.Body.Close()
		if ready.StatusCode == 503 {
			break
		}
		if time.Since(signalled) > 10*time.Second {
			t.Fatalf("/readyz = %d 10s after SIGTERM, want 503", ready.StatusCode)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err != nil {
		t.Errorf("connections refused %v after SIGTERM, when /readyz had just failed: want them accepted for the %v drain delay (%v)",
			time.Since(signalled), drain, err)
	} else {
		conn.Close()
	}
	// After the drain delay the listener is closed: new connections fail,
	// never before the delay since the signal was sent.
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			if d := time.Since(signalled); d < drain {
				t.Errorf("new connections refused %v after SIGTERM, before the %v drain delay", d, drain)
			}
			break
		}
		conn.Close()
		if time.Since(signalled) > 10*time.Second {
			t.Fatal("still accepting connections 10s after SIGTERM")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The stream in flight completes intact.
	rest, err := readAllString(br)
	if err != nil {
		t.Fatalf("the stream in flight was cut: %v", err)
	}
	stream := first + rest
	if n := strings.Count(stream, `"delta":{"content":`); n != 40 {
		t.Errorf("%d token events, want 40", n)
	}
	if !strings.Contains(stream, `"metrics":{"time_to_first_token_ms":`) || !strings.HasSuffix(stream, "data: [DONE]\n\n") {
		t.Errorf("stream ended without its metrics or [DONE]:\n%s", stream[max(0, len(stream)-400):])
	}
	if err := sc.wait(t, 10*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v, want 0", err)
	}
}

func readAllString(br *bufio.Reader) (string, error) {
	b, err := io.ReadAll(br)
	return string(b), err
}

// TestShutdownCutsHTTP10StreamsAtTheGrace: at SIGTERM, a stream to an
// HTTP/1.0 client (close-delimited, written on a connection fasthttp has
// handed over) is drained like any other; one that outlasts the grace is
// cut, logged once in the access log with its status, its bytes and
// cut_at_shutdown, and the last log line says how many streams were cut.
func TestShutdownCutsHTTP10StreamsAtTheGrace(t *testing.T) {
	engine := startEngine(t, emulator.Config{Timing: emulator.Timing{ITL: 50 * time.Millisecond, OutputTokens: 400}}) // 20 s
	sc := startSidecar(t, []string{"--upstream", engine.URL(), "--shutdown-grace", "1s"})
	c, err := net.Dial("tcp", strings.TrimPrefix(sc.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second)) //nolint:errcheck // a hang fails, not stalls
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	io.WriteString(c, "POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "+
		strconv.Itoa(len(body))+"\r\n\r\n"+body)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	stream := bufio.NewReader(resp.Body)
	if _, err := stream.ReadString('\n'); err != nil { // the first event has come
		t.Fatal(err)
	}
	sc.cmd.Process.Signal(syscall.SIGTERM)
	rest, _ := io.ReadAll(stream)
	if strings.Contains(string(rest), "[DONE]") {
		t.Fatal("a 20 s stream ran to its end within a 1 s grace")
	}
	logs := sc.logLines(t)
	if err := sc.wait(t, 10*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v, want 0", err)
	}
	if last := logs[len(logs)-1]; !strings.Contains(last, `"msg":"timing-sidecar stopped"`) || !strings.Contains(last, `"streams_cut":1`) {
		t.Fatalf("last log line %s, want the stop with streams_cut 1", last)
	}
	select {
	case line := <-sc.accessLog:
		if !strings.Contains(line, `"status":200`) || !strings.Contains(line, `"cut_at_shutdown":true`) || strings.Contains(line, `"bytes_out":0,`) {
			t.Fatalf("access log %s, want the stream's line, cut", line)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the cut stream has no access log line")
	}
}
