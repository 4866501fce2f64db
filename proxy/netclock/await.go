package netclock

import (
	"errors"
	"net"
	"time"
)

// WaitForKernelStamps waits up to timeout until the kernel stamps received
// TCP data. The kernel switches stamping on in a work item after the first
// socket asks (KernelTimestamps keeps it on from then), which a busy
// machine runs late: what checks a kernel stamp waits for it first.
func WaitForKernelStamps(timeout time.Duration) error {
	if !KernelTimestamps() {
		return errors.New("this platform gives no kernel receive timestamps")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	w, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return err
	}
	defer w.Close()
	r, err := ln.Accept()
	if err != nil {
		return err
	}
	rc := New(r, true)
	defer rc.Close()
	buf := make([]byte, 1)
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); {
		if _, err := w.Write(buf); err != nil {
			return err
		}
		if _, err := rc.Read(buf); err != nil {
			return err
		}
		if rc.kernel != nil && rc.kernel.stamped {
			return nil
		}
	}
	return errors.New("the kernel did not stamp received data in time")
}
