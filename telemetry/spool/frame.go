package spool

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
)

// An entry on disk is a frame: its payload's length and CRC-32C, its
// kind, the id's length and the id, then the data. The checksum covers
// everything after itself, so a frame cut short by a kill, or a block the
// disk lost, reads as the end of what is good, never as a record.
//
//	u32 length of kind..data (little-endian) | u32 CRC-32C of kind..data | kind | u8 len(id) | id | data
const (
	frameHeader = 8
	// MaxEntry bounds an entry's size: a usage record is about a
	// kilobyte; a length past this is a corrupt frame.
	MaxEntry = 64 << 10
	// MaxID bounds an id's length.
	MaxID = 255
)

// Kind is what an entry says of a request.
type Kind byte

const (
	// Start is written when a request is forwarded: its data is the
	// record it gets if the sidecar's process ends before the request
	// does. Readers never see starts; Open turns a start with no end
	// into an end of its own data.
	Start Kind = 'S'
	// End is a finished request's record, delivered to every reader.
	End Kind = 'E'
	// Cancel withdraws a start whose end was refused: the request is
	// not lost, its record was never taken. A cancel with no id is a
	// segment's mark: every start in flight as it began is before it
	// (segment.go). Earlier versions read it as a cancel of nothing.
	Cancel Kind = 'C'
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// crc is the checksum frames and cursor files carry.
func crc(b []byte) uint32 { return crc32.Checksum(b, crcTable) }

var (
	errEntryTooLarge = errors.New("spool entry larger than 64 KiB")
	errIDTooLong     = errors.New("spool entry id longer than 255 bytes")
)

// appendFrame appends one entry's frame to b.
func appendFrame(b []byte, kind Kind, id string, data []byte) ([]byte, error) {
	n := 2 + len(id) + len(data)
	switch {
	case len(id) > MaxID:
		return b, errIDTooLong
	case frameHeader+n > MaxEntry:
		return b, errEntryTooLarge
	}
	start := len(b)
	b = binary.LittleEndian.AppendUint32(b, uint32(n))
	b = append(b, 0, 0, 0, 0)
	b = append(b, byte(kind), byte(len(id)))
	b = append(b, id...)
	b = append(b, data...)
	binary.LittleEndian.PutUint32(b[start+4:], crc(b[start+frameHeader:]))
	return b, nil
}

// frameSize is the size on disk of an entry.
func frameSize(id string, data []byte) int64 { return int64(frameHeader + 2 + len(id) + len(data)) }

// entry is one frame read back.
type entry struct {
	kind Kind
	id   []byte
	data []byte
	size int // the whole frame's
}

// parseFrame reads the frame at the start of b. ok is false when b holds
// no whole, valid frame there: the end of what was written, or a corrupt
// one; short says b may simply end too soon (read more and try again).
func parseFrame(b []byte) (e entry, ok, short bool) {
	if len(b) < frameHeader {
		return entry{}, false, true
	}
	n := int(binary.LittleEndian.Uint32(b))
	if n < 2 || frameHeader+n > MaxEntry {
		return entry{}, false, false
	}
	if len(b) < frameHeader+n {
		return entry{}, false, true
	}
	body := b[frameHeader : frameHeader+n]
	if crc(body) != binary.LittleEndian.Uint32(b[4:]) {
		return entry{}, false, false
	}
	idLen := int(body[1])
	if k := Kind(body[0]); 2+idLen > n || k != Start && k != End && k != Cancel {
		return entry{}, false, false
	}
	return entry{kind: Kind(body[0]), id: body[2 : 2+idLen], data: body[2+idLen:], size: frameHeader + n}, true, false
}
