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
	authoritytest.Run(t, split.New(enforcement.NewMemoryAuthority(nil, 0), nil))
}
