package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// StripeMockVersion is Stripe's own API server for tests: it checks every
// request against Stripe's OpenAPI description and keeps no state, so a
// test counts what an export sent from the export's own record.
const StripeMockVersion = "github.com/stripe/stripe-mock@v0.203.0"

var stripeMock struct {
	once sync.Once
	bin  string
	err  error
}

// StartStripeMock builds stripe-mock from the module proxy (once per test
// binary, into the user's cache directory, where later runs find it
// built) and runs it on a free loopback port
// until the test ends; it returns its base URL.
func StartStripeMock(tb testing.TB) string {
	tb.Helper()
	stripeMock.once.Do(func() {
		cache, err := os.UserCacheDir()
		if err != nil {
			stripeMock.err = err
			return
		}
		gobin := filepath.Join(cache, "ratewarden-testenv", strings.ReplaceAll(filepath.Base(StripeMockVersion), "@", "-"))
		install := exec.Command("go", "install", StripeMockVersion)
		install.Env = append(os.Environ(), "GOBIN="+gobin, "GOFLAGS=")
		if out, err := install.CombinedOutput(); err != nil {
			stripeMock.err = fmt.Errorf("go install %s: %v\n%s", StripeMockVersion, err, out)
			return
		}
		stripeMock.bin = filepath.Join(gobin, "stripe-mock")
	})
	if stripeMock.err != nil {
		tb.Fatal(stripeMock.err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", FreePort(tb))
	log := filepath.Join(tb.TempDir(), "stripe-mock.log")
	p, err := startProcess("stripe-mock", log, stripeMock.bin, "-http-addr", addr)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Kill)
	if err := waitTCP(addr, time.Minute); err != nil {
		b, _ := os.ReadFile(log)
		tb.Fatalf("stripe-mock: %v\n%s", err, b)
	}
	return "http://" + addr
}
