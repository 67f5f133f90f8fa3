package hotkeys

// sketch is the space-saving algorithm (Metwally, Agrawal, El Abbadi 2005)
// over at most capacity counters: a key already counted is incremented; a
// new key takes over the smallest counter and inherits its count as its
// error. Every key whose true count exceeds total ÷ capacity is held, and a
// held key's count overestimates the truth by at most its err. Not safe for
// concurrent use; its owner serialises access.
type sketch struct {
	capacity int
	m        map[id]*counter
	heap     []*counter // min-heap by count
}

type id struct{ key, scope string }

type counter struct {
	id     id
	count  uint64 // an overestimate by at most err
	err    uint64
	shared uint64 // of count, decisions the shared tier answered (exact only while held)
	idx    int
}

func newSketch(capacity int) *sketch {
	return &sketch{capacity: capacity, m: make(map[id]*counter, capacity)}
}

func (s *sketch) add(k id, shared bool) {
	var sh uint64
	if shared {
		sh = 1
	}
	if c := s.m[k]; c != nil {
		c.count++
		c.shared += sh
		s.down(c.idx)
		return
	}
	// Copy the strings: the caller's may point into a reused request
	// buffer. One copy holds both: over many keys nearly every decision
	// takes over a counter, and two copies were two allocations each time.
	k = cloneID(k)
	if len(s.heap) < s.capacity {
		c := &counter{id: k, count: 1, shared: sh, idx: len(s.heap)}
		s.heap = append(s.heap, c)
		s.m[k] = c
		s.up(c.idx)
		return
	}
	c := s.heap[0]
	delete(s.m, c.id)
	c.id, c.err, c.count, c.shared = k, c.count, c.count+1, sh
	s.m[k] = c
	s.down(0)
}

// cloneID copies k's strings into one new string.
func cloneID(k id) id {
	both := k.key + k.scope // a new string: concatenation copies
	if len(k.key) == 0 || len(k.scope) == 0 {
		// One side empty: the concatenation may return the other side
		// itself, uncopied.
		both = string([]byte(both))
	}
	return id{both[:len(k.key)], both[len(k.key):]}
}

func (s *sketch) up(i int) {
	h := s.heap
	for i > 0 {
		p := (i - 1) / 2
		if h[p].count <= h[i].count {
			return
		}
		h[p], h[i] = h[i], h[p]
		h[p].idx, h[i].idx = p, i
		i = p
	}
}

func (s *sketch) down(i int) {
	h := s.heap
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && h[r].count < h[l].count {
			m = r
		}
		if h[i].count <= h[m].count {
			return
		}
		h[i], h[m] = h[m], h[i]
		h[i].idx, h[m].idx = i, m
		i = m
	}
}
