package spool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// A reader's position is saved in NAME.cursor: two numbers and their
// checksum on one line. It is replaced as SQLite and etcd replace a file
// that must survive: written whole under a temporary name, synced,
// renamed over the old one, and the directory synced. A power cut leaves
// the old position or the new one, never a torn one; an old one only
// delivers again.

func (s *Spool) cursorPath(name string) string { return filepath.Join(s.opts.Dir, name+".cursor") }

// save writes the reader's position to its cursor file: at most the end
// of what a failed segment still named on the disk is known to hold. Were
// a position saved past it, a power cut could bring back frames its sync
// never vouched for (ends delivered from their copies elsewhere, or not at
// all), behind every reader; a restart reads them again instead.
func (r *Reader) save(p position) error {
	r.s.mu.Lock()
	for _, f := range r.s.failed {
		if f.before(p) {
			p = f
		}
	}
	r.s.mu.Unlock()
	if p == r.saved {
		return nil
	}
	fs, path := r.s.fs, r.s.cursorPath(r.name)
	line := fmt.Appendf(nil, "%d %d", p.seq, p.off)
	line = fmt.Appendf(line, " %08x\n", crc(line))
	f, err := fs.OpenFile(path+tmpSuffix, os.O_CREATE|os.O_TRUNC|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(line)
	if err == nil {
		err = f.Sync()
	}
	err = errors.Join(err, f.Close())
	if err == nil {
		err = fs.Rename(path+tmpSuffix, path)
	}
	if err == nil {
		err = fs.SyncDir(r.s.opts.Dir)
	}
	if err != nil {
		return err
	}
	r.saved = p
	return nil
}

// readCursor reads a reader's saved position; the zero position when it
// has none, or one that does not read back whole.
func (s *Spool) readCursor(name string) (position, error) {
	b, err := readFile(s.fs, s.cursorPath(name))
	if errors.Is(err, os.ErrNotExist) {
		return position{}, nil
	}
	if err != nil {
		return position{}, fmt.Errorf("usage spool: read %s's position: %w", name, err)
	}
	fields := strings.Fields(string(b))
	if len(fields) != 3 {
		return position{}, nil
	}
	seq, err1 := strconv.ParseUint(fields[0], 10, 64)
	off, err2 := strconv.ParseInt(fields[1], 10, 64)
	sum, err3 := strconv.ParseUint(fields[2], 16, 32)
	if err1 != nil || err2 != nil || err3 != nil || uint32(sum) != crc([]byte(fields[0]+" "+fields[1])) {
		return position{}, nil
	}
	return position{seq, off}, nil
}

// resume is where a reader saved at p goes on: p in its segment (at most
// its end, past a tail cut short); the start of the next segment, when
// its own is gone (every reader was past it); from the first segment when
// p is none, or past every segment (a directory emptied by hand), which
// at worst delivers again.
func (s *Spool) resume(p position) position {
	if len(s.segs) == 0 {
		return position{s.nextSeq, 0}
	}
	first, last := s.segs[0], s.segs[len(s.segs)-1]
	if p.seq == 0 || p.seq > last.seq {
		return position{first.seq, 0}
	}
	for _, seg := range s.segs {
		switch {
		case seg.seq == p.seq:
			return position{p.seq, min(p.off, seg.size)}
		case seg.seq > p.seq:
			return position{seg.seq, 0}
		}
	}
	return position{first.seq, 0}
}
