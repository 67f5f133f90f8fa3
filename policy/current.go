package policy

import (
	"fmt"
	"os"
	"sync"
	"time"
)

// Current is the policy file at a path for readers off the request path (the
// usage API, the reconciler): Get re-reads the file when its modification
// time or size changed since the last read, and a file that fails to load
// keeps the previous policy (the limiter does the same on reload), so the
// accounting side and the limiter resolve with the same file. Safe for
// concurrent use.
type Current struct {
	path    string
	refused func(error) // told about a file that failed to load; may be nil

	mu    sync.Mutex
	pol   *Policy
	stamp fileStamp
}

type fileStamp struct {
	mod  time.Time
	size int64
}

// NewCurrent returns a Current for path. refused, when not nil, is called
// with the error of every read that is refused while a previous policy is
// kept in force.
func NewCurrent(path string, refused func(error)) *Current {
	return &Current{path: path, refused: refused}
}

// Get returns the policy in force: the file as last read successfully,
// re-read first when it changed. It fails only while no version of the file
// has ever loaded.
func (c *Current) Get() (*Policy, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st, err := os.Stat(c.path)
	if err != nil {
		if c.pol != nil {
			return c.pol, nil
		}
		return nil, fmt.Errorf("policy file: %w", err)
	}
	stamp := fileStamp{mod: st.ModTime(), size: st.Size()}
	if c.pol != nil && stamp == c.stamp {
		return c.pol, nil
	}
	p, err := Load(c.path)
	if err != nil {
		if c.pol != nil {
			if c.refused != nil {
				c.refused(err)
			}
			c.stamp = stamp // refuse a broken file once, not on every Get
			return c.pol, nil
		}
		return nil, err
	}
	c.pol, c.stamp = p, stamp
	return p, nil
}

// HasQuotas reports whether any tier or rule of the policy sets a calendar
// quota. With none, the accounting side has nothing to reconcile.
func (p *Policy) HasQuotas() bool {
	for _, t := range p.file.Tiers {
		if t.Quota != nil {
			return true
		}
	}
	for _, r := range p.file.Rules {
		if r.Quota != nil {
			return true
		}
	}
	return false
}
