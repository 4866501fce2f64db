//go:build !linux

package spool

import "errors"

// Reserve is Linux's alone: elsewhere a new segment takes the room it
// finds.
func (osFile) Reserve(int64) error { return errors.ErrUnsupported }
