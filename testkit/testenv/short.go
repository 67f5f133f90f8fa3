package testenv

import (
	"flag"
	"testing"
)

// SkipShort skips tb in -short mode (make check). Every helper here that
// starts a server, a broker or a process calls it first, so the short tier
// starts none and needs nothing installed; a test that starts a process
// without this package (it builds and runs a binary itself) calls it too.
func SkipShort(tb testing.TB) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("starts a server or a process: not in -short mode (make test runs it)")
	}
}

// Short reports whether the tests run in -short mode. Unlike
// testing.Short it may be called from TestMain before m.Run (it parses
// the command line first), so that a TestMain starts or builds nothing
// for a short run.
func Short() bool {
	if !flag.Parsed() {
		flag.Parse()
	}
	return testing.Short()
}
