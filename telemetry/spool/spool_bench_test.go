package spool

import (
	"fmt"
	"testing"
)

// record is the size of a usage record with a few long names.
var benchRecord = make([]byte, 900)

// BenchmarkAppend is what a request pays the spool: its start and its
// end, each one write(2) into the page cache, with no sync.
func BenchmarkAppend(b *testing.B) {
	s, _ := open(b, b.TempDir(), Options{MaxSize: 1 << 40, Readers: []string{"a"}})
	defer s.Close()
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = fmt.Sprintf("0193a0b1-c2d3-7e4f-8a9b-%012x", i)
	}
	b.SetBytes(2 * int64(len(benchRecord)))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		id := ids[i%len(ids)]
		i++
		if err := s.Append(Start, id, benchRecord); err != nil {
			b.Fatal(err)
		}
		if err := s.Append(End, id, benchRecord); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSyncBatch is the sync that makes a batch of records durable on
// the disk (fdatasync of the segment and of the directory), per batch of
// the size one interval holds.
func BenchmarkSyncBatch(b *testing.B) {
	for _, n := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			s, _ := open(b, b.TempDir(), Options{MaxSize: 1 << 40, Sync: 1 << 62, Readers: []string{"a"}})
			defer s.Close()
			for b.Loop() {
				for j := range n {
					if err := s.Append(End, fmt.Sprint(j), benchRecord); err != nil {
						b.Fatal(err)
					}
				}
				if err := s.Sync(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRequestDelivered is the spool's whole cost per request with
// one sink keeping up: its start and end appended, then, per 100
// requests, the sync that makes them durable, the batch read and its
// acknowledgement (the position saved).
func BenchmarkRequestDelivered(b *testing.B) {
	s, _ := open(b, b.TempDir(), Options{MaxSize: 1 << 40, Sync: 1 << 62, Readers: []string{"a"}})
	defer s.Close()
	r := s.Reader("a")
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = fmt.Sprintf("0193a0b1-c2d3-7e4f-8a9b-%012x", i)
	}
	b.SetBytes(2 * int64(len(benchRecord)))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		id := ids[i%len(ids)]
		i++
		if err := s.Append(Start, id, benchRecord); err != nil {
			b.Fatal(err)
		}
		if err := s.Append(End, id, benchRecord); err != nil {
			b.Fatal(err)
		}
		if i%100 != 0 {
			continue
		}
		if err := s.Sync(); err != nil {
			b.Fatal(err)
		}
		batch, err := r.Next(500, 1<<20)
		if err != nil || len(batch.Records) != 100 {
			b.Fatalf("batch of %d, %v", len(batch.Records), err)
		}
		if err := r.Ack(batch); err != nil {
			b.Fatal(err)
		}
	}
}
