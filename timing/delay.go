package timing

import (
	"math"
	"math/bits"
	"time"
)

// Delays summarises one request's relay delays: for each event, the time
// from the kernel receiving it from the engine to the sidecar handing it to
// the client's socket. It is the sidecar's own added delay, the figure that
// shows a sidecar starved of CPU. Its median comes from a log-scale
// histogram with four buckets per doubling (the midpoint of the true
// median's bucket, within 12% of it), from 1 µs to 2^28 µs; the maximum is exact. It
// is a fixed-size value, so observing allocates nothing.
type Delays struct {
	count  uint32
	max    time.Duration
	bucket [delayBuckets]uint32
}

const (
	delaySubBits = 2 // 4 buckets per doubling
	delayOctaves = 28
	delayBuckets = delayOctaves << delaySubBits
)

// Observe records one event's delay; a negative one (a clock step) counts
// as zero.
func (d *Delays) Observe(delay time.Duration) {
	delay = max(delay, 0)
	d.count++
	d.max = max(d.max, delay)
	d.bucket[delayBucket(delay)]++
}

// Count is the number of events observed.
func (d *Delays) Count() int { return int(d.count) }

// Max is the largest delay observed.
func (d *Delays) Max() time.Duration { return d.max }

// Median is the middle delay: the geometric midpoint of the bucket that
// holds it, never more than the maximum. Zero when nothing was observed.
func (d *Delays) Median() time.Duration {
	if d.count == 0 {
		return 0
	}
	rank := (d.count + 1) / 2 // the lower median of an even count
	var seen uint32
	for i, n := range d.bucket {
		seen += n
		if seen >= rank {
			if i == delayBuckets-1 {
				return d.max // the open-ended last bucket
			}
			return min(delayMidpoint(i), d.max)
		}
	}
	return d.max
}

// delayBucket is the bucket of a delay: below 1 µs the first; then four per
// doubling, by the two bits below the leading one; past the last octave
// the last bucket.
func delayBucket(delay time.Duration) int {
	us := uint64(delay / time.Microsecond)
	if us == 0 {
		return 0
	}
	octave := bits.Len64(us) - 1 // us in [2^octave, 2^(octave+1))
	if octave >= delayOctaves {
		return delayBuckets - 1
	}
	var sub uint64
	if octave >= delaySubBits {
		sub = (us >> (octave - delaySubBits)) & (1<<delaySubBits - 1)
	} else {
		sub = (us << (delaySubBits - octave)) & (1<<delaySubBits - 1)
	}
	return octave<<delaySubBits | int(sub)
}

// delayMidpoint is the middle of bucket i: the geometric mean of its
// bounds.
func delayMidpoint(i int) time.Duration {
	octave, sub := i>>delaySubBits, i&(1<<delaySubBits-1)
	// Bounds in µs: 2^octave × (1 + sub/4) to 2^octave × (1 + (sub+1)/4).
	lo := float64(uint64(1)<<octave) * (1 + float64(sub)/(1<<delaySubBits))
	hi := float64(uint64(1)<<octave) * (1 + float64(sub+1)/(1<<delaySubBits))
	return time.Duration(math.Sqrt(lo*hi) * float64(time.Microsecond))
}
