package slots

// Design: a full mark is the store's last refusal of a slot set, kept so
// that the requests behind it are refused in process, without a store
// call, for a short while. It records how many slots the store said were
// held; a request is refused on it only while its class's limit is at
// most that many. It never admits: slots held stay ≤ N whatever it says.
// What it costs is a slot freed and left idle for a while, so it lasts
// the shortest of:
//
//   - FullFor after the refused call started: a slot released through
//     another limiter, which this one cannot see, is refused here for at
//     most that long;
//   - the store's time until the earliest lease held ends (less 1 ms, the
//     store's rounding): a lease that ends unrenewed is never hidden, so a
//     dead holder's slot returns exactly as without marks;
//   - the next release this limiter makes in the set, or the next
//     admission the store grants in it (both clear the mark).
//
// A class of share 1 under a policy with lower classes is never refused
// on a mark: its share is a guarantee, and a stale mark would break it
// for up to FullFor after a release elsewhere. The lower classes, which
// are the flood under overload, are refused locally.

import (
	"sync"
	"time"
)

// DefaultFullFor is how long at most a full mark refuses requests in
// process after the store refused one (Config.FullFor).
const DefaultFullFor = 100 * time.Millisecond

// fullMark is one set's mark; it is never changed once stored.
type fullMark struct {
	held    int64     // slots held, as the store said when it refused
	until   time.Time // the mark refuses before it
	retryAt time.Time // when the earliest lease held ends unless renewed
}

// fullMarks maps a slot set (setID) to its *fullMark. Safe for concurrent
// use; the zero value is empty.
type fullMarks struct{ m sync.Map }

// refuse is the refusal of a request of class limit on the set's mark, if
// it stands at now and reaches the limit.
func (f *fullMarks) refuse(id setID, limit, capacity int64, now time.Time) (Grant, bool) {
	v, ok := f.m.Load(id)
	if !ok {
		return Grant{}, false
	}
	mk := v.(*fullMark)
	if !now.Before(mk.until) || mk.held < limit {
		return Grant{}, false
	}
	return Grant{Reason: reasonOf(mk.held, capacity), Held: mk.held,
		RetryAfter: max(time.Millisecond, mk.retryAt.Sub(now)), Now: now}, true
}

// mark records the store's refusal gr of a call started at start.
func (f *fullMarks) mark(id setID, start time.Time, gr Grant, fullFor time.Duration) {
	last := min(fullFor, gr.RetryAfter-time.Millisecond)
	if last <= 0 {
		return
	}
	f.m.Store(id, &fullMark{held: gr.Held, until: start.Add(last), retryAt: start.Add(gr.RetryAfter)})
}

// clear drops the set's mark: this limiter saw a slot come back.
func (f *fullMarks) clear(id setID) {
	if _, ok := f.m.Load(id); ok {
		f.m.Delete(id)
	}
}

// sweep drops the marks that no longer stand, and reports how many do.
func (f *fullMarks) sweep(now time.Time) int {
	n := 0
	f.m.Range(func(k, v any) bool {
		if !now.Before(v.(*fullMark).until) {
			f.m.CompareAndDelete(k, v)
		} else {
			n++
		}
		return true
	})
	return n
}
