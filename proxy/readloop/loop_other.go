//go:build !linux

package readloop

import (
	"errors"
	"iter"
)

// Loop has no implementation here: Shared returns nil.
type Loop struct{}

// Shared returns nil: the loops need epoll.
func Shared() *Loop { return nil }

func (l *Loop) ring(t *Task)                   {}
func (l *Loop) register(t *Task, fd int) error { return errors.ErrUnsupported }
func (l *Loop) unregister(fd int)              {}

func pull(t *Task, fn func(*Task)) {
	t.next, t.stop = iter.Pull(func(yield func(reason) bool) {
		t.yield = yield
		defer t.finish()
		fn(t)
	})
}
