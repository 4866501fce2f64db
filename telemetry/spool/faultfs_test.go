package spool

import (
	"bytes"
	"errors"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// faultFS is a filesystem in memory that keeps what the disk holds apart
// from what reads see (the page cache), so that a test can imitate each
// fault the spool must survive:
//   - a kill: the files as they are (the kernel holds what was written);
//   - a power cut (cut): each file cut back to what its last sync made
//     durable, and the directory's changes since its last sync dropped,
//     kept, or kept at random;
//   - a full disk: writes past capacity cut short with ENOSPC;
//   - a failing disk: any operation failing when fault says so. A failed
//     Sync drops the file's unsynced pages for good, as Linux does: a later
//     Sync succeeds and they never reach the disk ("fsyncgate").
type faultFS struct {
	mu sync.Mutex
	// names is the directory now; durable, as the disk holds it; ops, the
	// changes since its last sync, in order.
	names   map[string]*inode
	durable map[string]*inode
	ops     []dirOp
	// capacity bounds the bytes all files hold; 0 is no bound.
	capacity int64
	// fault, when set, is asked before each operation on name: an error
	// to fail it with, and for a write, how many of its bytes land first.
	fault func(op, name string, n int) (int, error)
	// rng, when set, has a failed sync write some of the file's pages
	// before it fails, as a disk may: the first of them, at random.
	rng *rand.Rand
}

type inode struct {
	data []byte // what reads see
	disk []byte // what the disk holds
	// dirtyFrom is the first byte written since the last sync; lost are
	// ranges a failed sync dropped, which no later sync writes.
	dirtyFrom int
	lost      [][2]int
	// reserved is the room held for it (Reserve).
	reserved int
}

type dirOp struct {
	op       string // "create", "remove", "rename"
	name, to string
	ino      *inode
}

func newFaultFS() *faultFS {
	return &faultFS{names: map[string]*inode{}, durable: map[string]*inode{}}
}

func (fs *faultFS) ask(op, name string, n int) (int, error) {
	if fs.fault == nil {
		return n, nil
	}
	return fs.fault(op, filepath.Base(name), n)
}

// used is the bytes the files hold; fs.mu held.
func (fs *faultFS) used() int64 {
	var n int64
	seen := map[*inode]bool{}
	for _, ino := range fs.names {
		if !seen[ino] {
			seen[ino] = true
			n += int64(max(len(ino.data), ino.reserved))
		}
	}
	return n
}

func (fs *faultFS) OpenFile(name string, flag int, _ os.FileMode) (file, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	ino, ok := fs.names[name]
	switch {
	case ok && flag&os.O_CREATE != 0 && flag&os.O_EXCL != 0:
		return nil, &os.PathError{Op: "open", Path: name, Err: syscall.EEXIST}
	case !ok && flag&os.O_CREATE == 0:
		return nil, &os.PathError{Op: "open", Path: name, Err: syscall.ENOENT}
	case !ok:
		if _, err := fs.ask("create", name, 0); err != nil {
			return nil, &os.PathError{Op: "open", Path: name, Err: err}
		}
		ino = &inode{}
		fs.names[name] = ino
		fs.ops = append(fs.ops, dirOp{op: "create", name: name, ino: ino})
	}
	if flag&os.O_TRUNC != 0 {
		ino.data = ino.data[:0]
		ino.dirtyFrom = 0
	}
	return &faultFile{fs: fs, name: name, ino: ino, append: flag&os.O_APPEND != 0}, nil
}

func (fs *faultFS) ReadDir(dir string) ([]string, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var out []string
	for name := range fs.names {
		if filepath.Dir(name) == filepath.Clean(dir) {
			out = append(out, filepath.Base(name))
		}
	}
	slices.Sort(out)
	return out, nil
}

func (fs *faultFS) Remove(name string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	ino, ok := fs.names[name]
	if !ok {
		return &os.PathError{Op: "remove", Path: name, Err: syscall.ENOENT}
	}
	if _, err := fs.ask("remove", name, 0); err != nil {
		return err
	}
	delete(fs.names, name)
	fs.ops = append(fs.ops, dirOp{op: "remove", name: name, ino: ino})
	return nil
}

func (fs *faultFS) Rename(from, to string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	ino, ok := fs.names[from]
	if !ok {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: syscall.ENOENT}
	}
	if _, err := fs.ask("rename", to, 0); err != nil {
		// A network filesystem may rename, then answer with an error.
		if fs.rng != nil && fs.rng.IntN(2) == 0 {
			delete(fs.names, from)
			fs.names[to] = ino
			fs.ops = append(fs.ops, dirOp{op: "rename", name: from, to: to, ino: ino})
		}
		return err
	}
	delete(fs.names, from)
	fs.names[to] = ino
	fs.ops = append(fs.ops, dirOp{op: "rename", name: from, to: to, ino: ino})
	return nil
}

func (fs *faultFS) SyncDir(dir string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if _, err := fs.ask("syncdir", dir, 0); err != nil {
		return err
	}
	fs.durable = maps.Clone(fs.names)
	fs.ops = nil
	return nil
}

func (fs *faultFS) MkdirAll(string) error { return nil }

// cutMode says what a power cut keeps of what was not synced.
type cutMode struct {
	// keepDirOps is the chance that each of the directory's changes
	// since its last sync is on the disk all the same: 0 drops them all
	// (the rule), 1 keeps them all (a journal committed them, not the
	// files' data).
	keepDirOps float64
	// torn keeps a random part of each file's unsynced appends.
	torn bool
	rng  *rand.Rand
}

// cut is the filesystem a machine finds after its power was cut.
func (fs *faultFS) cut(m cutMode) *faultFS {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	dir := maps.Clone(fs.durable)
	for _, op := range fs.ops {
		if m.keepDirOps < 1 && (m.keepDirOps == 0 || m.rng.Float64() >= m.keepDirOps) {
			continue
		}
		switch op.op {
		case "create":
			dir[op.name] = op.ino
		case "remove":
			if dir[op.name] == op.ino {
				delete(dir, op.name)
			}
		case "rename":
			if dir[op.name] == op.ino {
				delete(dir, op.name)
				dir[op.to] = op.ino
			}
		}
	}
	after := newFaultFS()
	made := map[*inode]*inode{}
	for _, name := range slices.Sorted(maps.Keys(dir)) {
		ino := dir[name]
		if _, ok := made[ino]; !ok {
			b := slices.Clone(ino.disk)
			if m.torn && len(ino.lost) == 0 && bytes.HasPrefix(ino.data, ino.disk) && len(ino.data) > len(ino.disk) {
				b = slices.Clone(ino.data[:len(ino.disk)+m.rng.IntN(len(ino.data)-len(ino.disk)+1)])
			}
			made[ino] = &inode{data: b, disk: slices.Clone(b), dirtyFrom: len(b)}
		}
		after.names[name] = made[ino]
	}
	after.durable = maps.Clone(after.names)
	return after
}

// kill is the filesystem a new process finds after a kill: the same one,
// with no fault to come.
func (fs *faultFS) kill() *faultFS {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.fault = nil
	return fs
}

// names lists the files, for a failing test's log.
func (fs *faultFS) String() string {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var out []string
	for name, ino := range fs.names {
		out = append(out, filepath.Base(name)+":"+strconv.Itoa(len(ino.data))+"/"+strconv.Itoa(len(ino.disk)))
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

type faultFile struct {
	fs     *faultFS
	name   string
	ino    *inode
	append bool
	closed bool
}

var errClosedFile = errors.New("file already closed")

func (f *faultFile) write(b []byte, off int) (int, error) {
	fs := f.fs
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if f.closed {
		return 0, errClosedFile
	}
	n, err := fs.ask("write", f.name, len(b))
	held := max(len(f.ino.data), f.ino.reserved)
	if grow := int64(off + n - held); fs.capacity > 0 && grow > 0 && fs.used()+grow > fs.capacity {
		n = max(0, int(fs.capacity-fs.used())+held-off)
		err = syscall.ENOSPC
	}
	if off > len(f.ino.data) {
		f.ino.data = append(f.ino.data, make([]byte, off-len(f.ino.data))...)
	}
	end := off + n
	if end > len(f.ino.data) {
		f.ino.data = append(f.ino.data, make([]byte, end-len(f.ino.data))...)
	}
	copy(f.ino.data[off:end], b[:n])
	f.ino.dirtyFrom = min(f.ino.dirtyFrom, off)
	if err == nil && n < len(b) {
		err = io.ErrShortWrite
	}
	return n, err
}

func (f *faultFile) Write(b []byte) (int, error) {
	f.fs.mu.Lock()
	off := len(f.ino.data)
	f.fs.mu.Unlock()
	if !f.append {
		panic("spool writes its files in O_APPEND")
	}
	return f.write(b, off)
}

func (f *faultFile) WriteAt(b []byte, off int64) (int, error) { return f.write(b, int(off)) }

func (f *faultFile) ReadAt(b []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if off >= int64(len(f.ino.data)) {
		return 0, io.EOF
	}
	n := copy(b, f.ino.data[off:])
	if n < len(b) {
		return n, io.EOF
	}
	return n, nil
}

func (f *faultFile) Truncate(size int64) error {
	fs := f.fs
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if _, err := fs.ask("truncate", f.name, 0); err != nil {
		return err
	}
	if int(size) < len(f.ino.data) {
		f.ino.data = f.ino.data[:size]
	} else {
		f.ino.data = append(f.ino.data, make([]byte, int(size)-len(f.ino.data))...)
	}
	f.ino.dirtyFrom = min(f.ino.dirtyFrom, int(size))
	return nil
}

func (f *faultFile) Reserve(n int64) error {
	fs := f.fs
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if _, err := fs.ask("reserve", f.name, 0); err != nil {
		return err
	}
	if grow := int64(int(n) - max(len(f.ino.data), f.ino.reserved)); fs.capacity > 0 && grow > 0 && fs.used()+grow > fs.capacity {
		return syscall.ENOSPC
	}
	f.ino.reserved = max(f.ino.reserved, int(n))
	return nil
}

func (f *faultFile) Size() (int64, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	return int64(len(f.ino.data)), nil
}

func (f *faultFile) Sync() error {
	fs := f.fs
	fs.mu.Lock()
	defer fs.mu.Unlock()
	ino := f.ino
	if _, err := fs.ask("sync", f.name, 0); err != nil {
		// The pages written since the last sync are dropped, marked
		// clean, never to be written; some of the first may have been.
		from := ino.dirtyFrom
		if fs.rng != nil && from < len(ino.data) && len(ino.lost) == 0 && len(ino.disk) <= from {
			from += fs.rng.IntN(len(ino.data) - from + 1)
			ino.disk = slices.Clone(ino.data[:from])
		}
		if from < len(ino.data) {
			ino.lost = append(ino.lost, [2]int{from, len(ino.data)})
		}
		ino.dirtyFrom = len(ino.data)
		return err
	}
	disk := slices.Clone(ino.data)
	for _, r := range ino.lost {
		for i := r[0]; i < r[1] && i < len(disk); i++ {
			disk[i] = 0
			if i < len(ino.disk) {
				disk[i] = ino.disk[i]
			}
		}
	}
	ino.disk = disk
	ino.dirtyFrom = len(ino.data)
	return nil
}

func (f *faultFile) Close() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.closed {
		return errClosedFile
	}
	f.closed = true
	return nil
}
