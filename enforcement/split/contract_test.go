package split_test

import (
	"testing"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/authoritytest"
	"github.com/ratewarden/ratewarden/enforcement/split"
)

// TestSplitContract: a limit that is not split passes the decorator
// unchanged, so the decorator is an authority like the one it wraps.
func TestSplitContract(t *testing.T) {
	// Room for every key of the suite: an empty bucket is never evicted,
	// and a key that finds its shard full of them is decided untracked.
	authoritytest.Run(t, split.New(enforcement.NewMemoryAuthority(nil, 1000), nil))
}
