package wanproxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
)

// Net is the set of links between regions, cut and healed by region (a
// region is cut off when every link it is an end of is cut). Its methods
// are safe for concurrent use; the set is fixed at NewNet.
type Net struct {
	links []*Link

	mu         sync.Mutex
	cutRegions map[string]bool
}

// NewNet returns a net of links.
func NewNet(links ...*Link) *Net {
	return &Net{links: slices.Clone(links), cutRegions: map[string]bool{}}
}

// Links are the net's links, in NewNet's order.
func (n *Net) Links() []*Link { return slices.Clone(n.links) }

// Link returns the link named name, or nil.
func (n *Net) Link(name string) *Link {
	for _, l := range n.links {
		if l.cfg.Name == name {
			return l
		}
	}
	return nil
}

// of are the links region is an end of.
func (n *Net) of(region string) []*Link {
	var out []*Link
	for _, l := range n.links {
		if l.cfg.From == region || l.cfg.To == region {
			out = append(out, l)
		}
	}
	return out
}

// CutRegion cuts every link of region and returns how many it has.
func (n *Net) CutRegion(region string) int {
	n.mu.Lock()
	n.cutRegions[region] = true
	n.mu.Unlock()
	ls := n.of(region)
	for _, l := range ls {
		l.Cut()
	}
	return len(ls)
}

// HealRegion heals every link of region, except those whose other end is
// a region that is itself cut off (CutRegion, not yet healed), and
// returns how many it healed.
func (n *Net) HealRegion(region string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.cutRegions, region)
	healed := 0
	for _, l := range n.of(region) {
		if n.cutRegions[l.cfg.From] || n.cutRegions[l.cfg.To] {
			continue
		}
		l.Heal()
		healed++
	}
	return healed
}

// Stats are every link's counters.
func (n *Net) Stats() []Stats {
	out := make([]Stats, 0, len(n.links))
	for _, l := range n.links {
		out = append(out, l.Stats())
	}
	return out
}

// Handler is the control endpoint, for loopback only:
//
//	GET  /links               every link's Stats, as JSON
//	POST /cut?region=b        cut every link of region b
//	POST /heal?region=b       heal them
//	POST /cut?link=b-a        cut (or /heal) one link
//
// A cut or heal answers the links' Stats after it; an unknown region or
// link is 404.
func (n *Net) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /links", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, n.Stats()) })
	act := func(cut bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			region, link := r.URL.Query().Get("region"), r.URL.Query().Get("link")
			switch {
			case region != "" && link == "":
				if len(n.of(region)) == 0 {
					http.Error(w, fmt.Sprintf("no link joins region %q", region), http.StatusNotFound)
					return
				}
				if cut {
					n.CutRegion(region)
				} else {
					n.HealRegion(region)
				}
			case link != "" && region == "":
				l := n.Link(link)
				if l == nil {
					http.Error(w, fmt.Sprintf("no link %q", link), http.StatusNotFound)
					return
				}
				if cut {
					l.Cut()
				} else {
					l.Heal()
				}
			default:
				http.Error(w, "give region=NAME or link=NAME", http.StatusBadRequest)
				return
			}
			writeJSON(w, n.Stats())
		}
	}
	mux.HandleFunc("POST /cut", act(true))
	mux.HandleFunc("POST /heal", act(false))
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
