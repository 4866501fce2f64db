package membudget

import (
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func TestTakeAndGive(t *testing.T) {
	b := New(100)
	if !b.Take(60, 0) || b.Take(41, 0) || !b.Take(40, 0) {
		t.Fatal("takes within the size must succeed, one past it must fail")
	}
	if b.Take(101, time.Hour) {
		t.Fatal("a take larger than the budget can never be had, so it does not wait")
	}
	b.Give(60)
	if got := b.Used(); got != 40 {
		t.Fatalf("used %d after giving back, want 40", got)
	}
	if !b.Take(0, 0) || b.Used() != 40 {
		t.Fatal("an empty take always succeeds and takes nothing")
	}
}

// TestAWaitingTakeGetsRoomGivenBack: a take that waits gets room as soon
// as it is given back, and one that cannot get it gives up at its bound.
func TestAWaitingTakeGetsRoomGivenBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := New(100)
		b.Charge(100)
		got := make(chan bool)
		go func() { got <- b.Take(50, time.Second) }()
		synctest.Wait()
		b.Give(50)
		if !<-got {
			t.Fatal("the waiting take did not get the room given back")
		}
		start := time.Now()
		if b.Take(50, Wait) {
			t.Fatal("a take got room that is not there")
		}
		if waited := time.Since(start); waited != Wait {
			t.Fatalf("gave up after %v, want %v", waited, Wait)
		}
	})
}

// TestReadAheadsHoldAQuarter: read-aheads together hold at most a quarter
// of the budget, so stalled streams cannot take the room request bodies
// need; what they give back is theirs again.
func TestReadAheadsHoldAQuarter(t *testing.T) {
	b := New(400)
	if !b.TakeAhead(60) || !b.TakeAhead(40) || b.TakeAhead(1) {
		t.Fatal("read-aheads must get 100 of 400 and not a byte more")
	}
	if !b.Take(300, 0) {
		t.Fatal("request bodies must still have the rest")
	}
	b.GiveAhead(40)
	if b.TakeAhead(41) || !b.TakeAhead(40) {
		t.Fatal("a read-ahead's room given back must be the read-aheads' again, and only that")
	}
	b.Give(300)
	if b.GiveAhead(100); b.Used() != 0 {
		t.Fatalf("used %d once everything was given back", b.Used())
	}
}

// TestChargeCountsWhatIsHeld: bytes held without room are counted, so
// takes fail until they are given back.
func TestChargeCountsWhatIsHeld(t *testing.T) {
	b := New(100)
	b.Charge(150)
	if b.Take(1, 0) || b.Used() != 150 {
		t.Fatalf("a take succeeded over a charged budget (used %d)", b.Used())
	}
	b.Give(150)
	if !b.Take(100, 0) {
		t.Fatal("room given back was not taken")
	}
}

// TestConcurrentTakesNeverOvercommit: many takers at once never hold more
// than the budget.
func TestConcurrentTakesNeverOvercommit(t *testing.T) {
	b := New(1000)
	var wg sync.WaitGroup
	var over sync.Once
	for range 8 {
		wg.Go(func() {
			for range 2000 {
				if b.Take(30, 0) {
					if b.Used() > 1000 {
						over.Do(func() { t.Error("more than the budget held") })
					}
					b.Give(30)
				}
			}
		})
	}
	wg.Wait()
	if b.Used() != 0 {
		t.Fatalf("used %d after every take was given back", b.Used())
	}
}

// TestOneBodyAtATimeWaitsToGrow: of the bodies that hold room, one at a
// time waits for more; another gives up at once, so that they never all
// wait on each other.
func TestOneBodyAtATimeWaitsToGrow(t *testing.T) {
	b := New(100)
	b.Charge(100)
	grew := make(chan bool)
	go func() { grew <- b.AwaitGrowth(10) }()
	for !b.growing.Load() || b.waiting.Load() != 1 {
		runtime.Gosched() // the first body is on its way to wait
	}
	if b.AwaitGrowth(10) {
		t.Fatal("a second body got room that is not there")
	}
	b.Give(50)
	if !<-grew {
		t.Fatal("the waiting body did not get the room given back")
	}
}

// TestMemoryReturnsOnceTheBudgetIsQuiet: the forced return of memory to
// the system waits until no large body is held, so that a burst of
// uploads gets one, after it, and never lands among them.
func TestMemoryReturnsOnceTheBudgetIsQuiet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := New(1 << 30)
		b.Charge(2 * returnMemoryAfter)
		b.Give(returnMemoryAfter) // one large body let go, another still held
		time.Sleep(5 * returnMemoryDelay)
		synctest.Wait()
		if !b.returning.Load() {
			t.Fatal("memory returned while a large body is held")
		}
		b.Give(returnMemoryAfter)
		time.Sleep(2 * returnMemoryDelay)
		synctest.Wait()
		if b.returning.Load() {
			t.Fatal("memory not returned once the budget was quiet")
		}
	})
}
