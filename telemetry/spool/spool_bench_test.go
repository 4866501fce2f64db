package spool

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// record is the size of a usage record with a few long names.
var benchRecord = make([]byte, 900)

// benchIDs is request ids as the sidecar makes them (UUIDv7), to reuse.
func benchIDs() []string {
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = fmt.Sprintf("0193a0b1-c2d3-7e4f-8a9b-%012x", i)
	}
	return ids
}

// BenchmarkAppend is what a request pays the spool: its start and its
// end, each one write(2) into the page cache, with no sync.
func BenchmarkAppend(b *testing.B) {
	s, _ := open(b, b.TempDir(), Options{MaxSize: 1 << 40, Readers: []string{"a"}})
	defer s.Close()
	ids := benchIDs()
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
	ids := benchIDs()
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

// BenchmarkDeliveryDelay is what handing readers only what is synced
// adds to a record's delivery: from its end's append to a reader holding
// it, with the sync loop at 100 ms (the delay scales with --usage-spool-sync:
// the wait for the next sync, then the sync). Run it with -benchtime 200x.
func BenchmarkDeliveryDelay(b *testing.B) {
	s, _ := open(b, b.TempDir(), Options{MaxSize: 1 << 40, Sync: 100 * time.Millisecond, Readers: []string{"a"}})
	defer s.Close()
	r := s.Reader("a")
	var delays []time.Duration
	i := 0
	for b.Loop() {
		id := fmt.Sprintf("req-%d", i)
		i++
		// Ends come at any moment of the sync interval.
		time.Sleep(time.Duration(i*37%100) * time.Millisecond)
		if err := s.Append(Start, id, benchRecord); err != nil {
			b.Fatal(err)
		}
		ended := time.Now()
		if err := s.Append(End, id, benchRecord); err != nil {
			b.Fatal(err)
		}
		for {
			batch, err := r.Next(10, 1<<20)
			if err != nil {
				b.Fatal(err)
			}
			if len(batch.Records) > 0 {
				delays = append(delays, time.Since(ended))
				r.Ack(batch) //nolint:errcheck // measured already
				break
			}
			<-r.Wake()
		}
	}
	slices.Sort(delays)
	var sum time.Duration
	for _, d := range delays {
		sum += d
	}
	b.ReportMetric(float64(sum.Milliseconds())/float64(len(delays)), "mean-ms")
	b.ReportMetric(float64(delays[len(delays)*99/100].Milliseconds()), "p99-ms")
	b.ReportMetric(float64(delays[len(delays)-1].Milliseconds()), "max-ms")
}
