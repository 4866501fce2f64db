package spool

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// lockName is the file in a spool's directory that its process holds an
// exclusive flock(2) on while the spool is open. Two processes appending
// to one spool would each delete segments the other has not delivered;
// the lock makes the second refuse to start. The kernel drops the lock
// when its holder dies, however it dies, so a restart after a SIGKILL or
// an OOM kill is never blocked by a stale file (the reason for flock over
// a pid file, as Prometheus's TSDB and etcd use it).
const lockName = "LOCK"

// ErrInUse is the refusal of a spool directory another open spool holds.
var ErrInUse = errors.New("usage spool in use by another process")

// lockDir takes the directory's lock, and writes the holder's pid into the
// lock file for the refusal a second process gets. The file stays open as
// long as the spool: closing it releases the lock. On a filesystem that
// has no locks (some NFS mounts) the spool opens unlocked, and failed
// hears of it: refusing to start would cost every record.
func lockDir(dir string, failed func(error)) (*os.File, error) {
	path := filepath.Join(dir, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("usage spool: lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is held by pid %s; give each sidecar a --usage-spool-dir of its own", ErrInUse, dir, holder(f))
		}
		if !errors.Is(err, syscall.ENOLCK) && !errors.Is(err, syscall.ENOTSUP) && !errors.Is(err, syscall.EINVAL) {
			return nil, fmt.Errorf("usage spool: lock %s: %w", path, err)
		}
		if failed != nil {
			failed(fmt.Errorf("usage spool: %s cannot be locked on this filesystem (%w): nothing keeps a second process off it", dir, err))
		}
		return os.OpenFile(path, os.O_RDWR, 0o600)
	}
	// The pid is only for that message: a failure to write it costs
	// nothing but the message's detail.
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0) //nolint:errcheck // see above
	}
	return f, nil
}

// holder is the pid the lock's holder wrote, or "unknown".
func holder(f *os.File) string {
	var b [32]byte
	n, _ := f.ReadAt(b[:], 0)
	pid := string(bytes.TrimSpace(b[:n]))
	if _, err := strconv.Atoi(pid); err != nil {
		return "unknown"
	}
	return pid
}
