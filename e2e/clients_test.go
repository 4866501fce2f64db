package e2e

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
	"github.com/timing-sidecar/timing-sidecar/e2e/needs"
)

// The sidecar's own errors must reach the HTTP clients people use, not as
// a reset. The hard case is a body over the limit from a client that
// writes its whole request before it reads: the sidecar answers 413 while
// the body still arrives. These run Python's and Node's standard HTTP
// clients (both on the CI machine) against the release binary.

// pythonOverLimit posts 20 MB with urllib five times and prints each status
// and error code, or the exception that replaced them.
const pythonOverLimit = `
import json, sys, urllib.request, urllib.error
for i in range(5):
    req = urllib.request.Request(sys.argv[1] + "/v1/chat/completions", data=b"x" * (20 << 20),
                                 headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=30)
        print("200 -")
    except urllib.error.HTTPError as e:
        print(e.code, json.load(e)["error"]["code"])
    except Exception as e:
        print("exception", repr(e))
`

// nodeOverLimit does the same with Node's http module.
const nodeOverLimit = `
const http = require("http");
const url = new URL(process.argv[1] + "/v1/chat/completions");
const body = Buffer.alloc(20 << 20, 120);
function once() {
  return new Promise((resolve) => {
    const req = http.request(url, { method: "POST", headers: { "Content-Type": "application/json", "Content-Length": body.length } }, (res) => {
      let data = "";
      res.on("data", (c) => (data += c));
      res.on("end", () => { try { resolve(res.statusCode + " " + JSON.parse(data).error.code); } catch (e) { resolve(res.statusCode + " unparsable"); } });
    });
    req.on("error", (e) => resolve("exception " + e.code));
    req.end(body);
  });
}
(async () => { for (let i = 0; i < 5; i++) console.log(await once()); })();
`

func TestRealClientsReadTheSidecarsErrors(t *testing.T) {
	engine := startEngine(t, emulator.Config{})
	s := startSidecar(t, []string{"--upstream", engine.URL(), "--max-request-body-size", "1048576"})
	for _, client := range []struct{ name, program, flag, script string }{
		{"python urllib", "python3", "-c", pythonOverLimit},
		{"node http", "node", "-e", nodeOverLimit},
	} {
		t.Run(client.name, func(t *testing.T) {
			needs.Program(t, client.program)
			out, err := exec.Command(client.program, client.flag, client.script, s.base).CombinedOutput()
			if err != nil {
				t.Fatalf("%s: %v\n%s", client.program, err, out)
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			if len(lines) != 5 {
				t.Fatalf("want five answers, got:\n%s", out)
			}
			for i, line := range lines {
				if line != "413 request_too_large" {
					t.Errorf("try %d got %q, want the 413 with its OpenAI error", i+1, line)
				}
			}
		})
	}
}
