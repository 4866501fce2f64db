package spool

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// holdEnv names the directory TestMain's child process holds a spool in.
const holdEnv = "TIMING_SIDECAR_TEST_HOLD_SPOOL"

// TestMain doubles as a second process: with holdEnv set, it opens the
// spool there, says so, and keeps it until it is killed.
func TestMain(m *testing.M) {
	if dir := os.Getenv(holdEnv); dir != "" {
		if _, _, err := Open(Options{Dir: dir, MaxSize: 1 << 20, Readers: []string{"a"}}); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("held")
		select {}
	}
	os.Exit(m.Run())
}

// A second process is refused a spool another holds, with the directory
// and the holder's pid; once the holder is killed, the spool opens at
// once, with no stale lock to clear.
func TestOneProcessPerSpool(t *testing.T) {
	dir := t.TempDir()
	holder := exec.Command(os.Args[0], "-test.run=^$")
	holder.Env = append(os.Environ(), holdEnv+"="+dir)
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Process.Kill()
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "held\n" {
		t.Fatalf("the holding process said %q", line)
	}

	_, _, err = Open(Options{Dir: dir, MaxSize: 1 << 20, Readers: []string{"a"}})
	if !errors.Is(err, ErrInUse) {
		t.Fatalf("a spool another process holds opened: %v", err)
	}
	for _, want := range []string{dir, "pid " + strconv.Itoa(holder.Process.Pid)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal %q does not name %q", err, want)
		}
	}

	if err := holder.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	holder.Wait() //nolint:errcheck // killed
	s, _, err := Open(Options{Dir: dir, MaxSize: 1 << 20, Readers: []string{"a"}})
	if err != nil {
		t.Fatalf("the spool of a killed process did not open: %v", err)
	}
	s.Close()
}

// Within one process too: a spool open twice is refused, and a closed one
// opens again.
func TestASpoolIsOpenOnce(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Dir: dir, MaxSize: 1 << 20, Readers: []string{"a"}}
	s, _, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(opts); !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("a spool opened twice: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, _, err = Open(opts)
	if err != nil {
		t.Fatalf("a closed spool did not open again: %v", err)
	}
	s.Close()
}
