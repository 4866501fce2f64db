package spool

import (
	"os"
)

// fileSystem is everything the spool asks of the disk. The spool uses the
// real one (osFS); its tests use one that imitates what a kill, a power
// cut, a full disk and a failing disk leave behind (faultfs_test.go), so
// that each promise is tested against its fault rather than the disk's
// luck.
type fileSystem interface {
	// OpenFile opens name as os.OpenFile does.
	OpenFile(name string, flag int, perm os.FileMode) (file, error)
	// ReadDir lists the names in dir.
	ReadDir(dir string) ([]string, error)
	Remove(name string) error
	Rename(from, to string) error
	// SyncDir makes dir's names durable: the files made, renamed and
	// removed in it since its last sync.
	SyncDir(dir string) error
	MkdirAll(dir string) error
}

// file is an open file of a fileSystem.
type file interface {
	Write(b []byte) (int, error)
	ReadAt(b []byte, off int64) (int, error)
	Truncate(size int64) error
	// Size is the file's size now.
	Size() (int64, error)
	// Reserve makes the filesystem hold n bytes of room for the file
	// without changing its size, so that appends within them never find
	// the disk full (fallocate with FALLOC_FL_KEEP_SIZE).
	Reserve(n int64) error
	// Sync makes what was written durable. Once it fails, the file's
	// pages written since its last sync may be gone for good, and a
	// later Sync that succeeds says nothing of them.
	Sync() error
	Close() error
}

// osFS is the real filesystem.
type osFS struct{}

type osFile struct{ *os.File }

func (f osFile) Size() (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

func (osFS) OpenFile(name string, flag int, perm os.FileMode) (file, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osFS) ReadDir(dir string) ([]string, error) {
	des, err := os.ReadDir(dir)
	names := make([]string, 0, len(des))
	for _, de := range des {
		if !de.IsDir() {
			names = append(names, de.Name())
		}
	}
	return names, err
}

func (osFS) Remove(name string) error     { return os.Remove(name) }
func (osFS) Rename(from, to string) error { return os.Rename(from, to) }
func (osFS) MkdirAll(dir string) error    { return os.MkdirAll(dir, 0o700) }
func (osFS) SyncDir(dir string) error     { return syncDir(dir) }
func syncDir(dir string) (err error) {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := d.Close(); err == nil {
			err = cerr
		}
	}()
	return d.Sync()
}

// readFile reads the whole of name through fsys.
func readFile(fsys fileSystem, name string) ([]byte, error) {
	f, err := fsys.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close() //nolint:errcheck // read only
	n, err := f.Size()
	if err != nil {
		return nil, err
	}
	b := make([]byte, n)
	got, err := f.ReadAt(b, 0)
	if got == len(b) {
		return b, nil
	}
	return b[:got], err
}
