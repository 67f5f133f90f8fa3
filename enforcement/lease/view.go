package lease

import "time"

// Held is what this instance holds of one (key, scope)'s bucket: leased
// tokens it spends in process (support tools show it beside the store's
// bucket, which has already counted them as spent).
type Held struct {
	Hot      bool      `json:"hot"`    // the key is hot here: its decisions spend leased tokens
	Tokens   int64     `json:"tokens"` // whole tokens held
	LeasedAt time.Time `json:"leasedAt,omitzero"`
}

// Held returns what this instance holds of (key, scope), creating
// nothing; false when it has never leased or tracked the key.
func (a *Authority) Held(key, scope string) (Held, bool) {
	k := id{key, scope}
	s := &a.shards[shardOf(k)]
	s.mu.RLock()
	st := s.m[k]
	s.mu.RUnlock()
	if st == nil {
		return Held{}, false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	h := Held{Hot: st.hot, Tokens: st.held}
	if st.leasedAt != 0 {
		h.LeasedAt = a.epoch.Add(time.Duration(st.leasedAt-1) * time.Microsecond)
	}
	return h, true
}
