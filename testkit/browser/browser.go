// Package browser starts headless Chromium for the dashboard's tests
// (chromedp) and gives them the folder their screenshots go to.
package browser

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/ratewarden/ratewarden/testkit/repo"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// Start starts a headless Chromium (a missing one fails the test: the
// harness installs it) and returns a chromedp context bounded by a
// generous deadline, for a browser that hangs, and its cancel.
func Start(t *testing.T) (context.Context, context.CancelFunc) {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium is not installed (make test installs it as root: scripts/deps.sh): %v", err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		// Chromium leaves its singleton socket's folder in TMPDIR when it
		// is killed, as cancel does: one per test, left in the machine's
		// TMPDIR for good unless TMPDIR is the test's own.
		chromedp.Env("TMPDIR=" + t.TempDir()),
		chromedp.WindowSize(1280, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	// A loaded machine starts Chromium slowly.
	ctx, cancelTimeout := context.WithTimeout(ctx, testenv.Timeout(3*time.Minute))
	return ctx, func() { cancelTimeout(); cancelCtx(); cancelAlloc() }
}

// Artifacts is <repo>/testdata-artifacts (git-ignored), where the browser
// tests leave their screenshots.
func Artifacts(t *testing.T) string {
	t.Helper()
	out := filepath.Join(repo.Root(t), "testdata-artifacts")
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	return out
}
