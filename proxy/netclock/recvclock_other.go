//go:build !linux || !(amd64 || arm64 || ppc64le || riscv64)

package netclock

import (
	"net"
	"time"
)

// kernelReader exists on 64-bit Linux only: elsewhere a read's time is the clock
// at the read.
type kernelReader struct {
	stamped bool
	held    []byte
}

func (*kernelReader) takeHeld() []byte { return nil }

func newKernelReader(net.Conn) *kernelReader { return nil }

func (*kernelReader) read([]byte) (int, time.Time, error) { return 0, time.Time{}, errNoKernelRead }

// KernelTimestamps: no receive timestamps here.
func KernelTimestamps() bool { return false }
