package wanproxy

import (
	"math"
	"math/rand/v2"
	"sync"
	"time"
)

// mss is the payload of one TCP segment on an Ethernet path (1500-byte
// MTU less 52 bytes of IP and TCP headers with timestamps): the unit a
// network loses.
const mss = 1448

// DefaultRTO is the retransmission timeout of a lost segment when
// Config.RTO is zero: Linux's minimum RTO (TCP_RTO_MIN), what a
// connection with a short round trip waits before it sends again.
const DefaultRTO = 200 * time.Millisecond

// schedule gives each chunk of one direction of one connection the time it
// is released to the far side. It is what makes the proxy a link rather
// than a sleep: a chunk is released at
//
//	max(arrival + delay × (1 + u), previous release)    u uniform in [−jitter, +jitter]
//
// so jitter never reorders a byte stream (TCP delivers in order: a late
// segment holds back the ones behind it), and a lost segment adds one RTO
// per loss (doubling, as TCP's backoff does, when the retransmission is
// lost too) to its chunk and, through the max, to every chunk behind it.
type schedule struct {
	delay  time.Duration
	jitter float64
	loss   float64
	rto    time.Duration
	rnd    *lockedRand
	last   time.Time
}

// release is the time a chunk of n bytes that arrived at arrival reaches
// the far side, and how many of its segments' transmissions were lost.
func (s *schedule) release(arrival time.Time, n int) (time.Time, int) {
	d := s.delay
	if s.jitter > 0 {
		d = time.Duration(float64(d) * (1 + s.jitter*(2*s.rnd.float64()-1)))
	}
	at := arrival.Add(d)
	lost := 0
	if s.loss > 0 && n > 0 {
		// The chunk is held up when any of its segments is lost; each
		// further loss of the retransmission doubles the wait.
		segs := (n + mss - 1) / mss
		pAny := 1 - math.Pow(1-s.loss, float64(segs))
		for rto := s.rto; s.rnd.float64() < pAny; rto *= 2 {
			at = at.Add(rto)
			lost++
			pAny = s.loss // the retransmission is one segment's worth of risk
		}
	}
	if at.Before(s.last) {
		at = s.last
	}
	s.last = at
	return at, lost
}

// lockedRand is a random source shared by every connection of a link.
type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func newLockedRand(seed uint64) *lockedRand {
	if seed == 0 {
		seed = rand.Uint64()
	}
	return &lockedRand{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

func (l *lockedRand) float64() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Float64()
}
