package spool

import "syscall"

func (f osFile) Reserve(n int64) error {
	const keepSize = 0x1 // FALLOC_FL_KEEP_SIZE
	return syscall.Fallocate(int(f.Fd()), keepSize, 0, n)
}
