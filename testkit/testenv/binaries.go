package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// RaceChildrenVar, set to 1, builds the binaries that tests run as
// processes with the race detector (make stress-test sets it). make test
// runs every package's tests with the race detector, so the code those
// processes run is raced in process; built without it, the processes
// take several times less CPU and the suite fits its time on two cores.
const RaceChildrenVar = "RATEWARDEN_RACE_CHILDREN"

// RaceChildren reports whether Binary builds with the race detector.
func RaceChildren() bool { return os.Getenv(RaceChildrenVar) == "1" }

const module = "github.com/ratewarden/ratewarden"

// binaries are the commands this test process built, each once.
var binaries struct {
	mu    sync.Mutex
	dir   string
	built map[string]*binary
}

type binary struct {
	once sync.Once
	path string
	err  error
}

// Binary returns the path of one of the project's commands (cmd, such as
// "cmd/limiter"), built the first time a test of this process asks for
// it; the tests that ask later, or at the same time, wait for that build.
// A package whose tests call Binary runs them with Main, which removes
// the binaries. In -short mode the test skips.
func Binary(tb testing.TB, cmd string) string {
	tb.Helper()
	SkipShort(tb)
	binaries.mu.Lock()
	if binaries.built == nil {
		binaries.built = map[string]*binary{}
	}
	b := binaries.built[cmd]
	if b == nil {
		b = &binary{}
		binaries.built[cmd] = b
	}
	binaries.mu.Unlock()
	b.once.Do(func() { b.path, b.err = Build(cmd) })
	if b.err != nil {
		tb.Fatal(b.err)
	}
	return b.path
}

// Build is Binary for a TestMain, which has no test to fail: it builds
// cmd every time it is called.
func Build(cmd string) (string, error) {
	binaries.mu.Lock()
	if binaries.dir == "" {
		dir, err := os.MkdirTemp("", "ratewarden-test-bin-")
		if err != nil {
			binaries.mu.Unlock()
			return "", err
		}
		binaries.dir = dir
	}
	dir := binaries.dir
	binaries.mu.Unlock()
	out := filepath.Join(dir, path.Base(cmd))
	args := []string{"build", "-o", out}
	env := os.Environ()
	if RaceChildren() {
		args = append(args, "-race")
	} else {
		// As the Dockerfile, make up and deploytest build them: one
		// configuration, so each package compiles once per run.
		env = append(env, "CGO_ENABLED=0")
	}
	c := exec.Command("go", append(args, module+"/"+strings.TrimPrefix(cmd, "./"))...)
	c.Env = env
	b, err := c.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", cmd, err, b)
	}
	return out, nil
}

// Main runs m's tests and removes the binaries they built with Binary;
// TestMain calls os.Exit(testenv.Main(m)).
func Main(m *testing.M) int {
	code := m.Run()
	binaries.mu.Lock()
	defer binaries.mu.Unlock()
	if binaries.dir != "" {
		os.RemoveAll(binaries.dir)
	}
	return code
}

// RaceReport is how a race-built process's output begins a report.
const RaceReport = "WARNING: DATA RACE"

// FailOnRaceReport fails tb, when it ends, if output (a process's log,
// read then) holds a race report: a process killed before it exits never
// reports through its exit status.
func FailOnRaceReport(tb testing.TB, name string, output func() string) {
	tb.Cleanup(func() {
		if out := output(); strings.Contains(out, RaceReport) {
			i := strings.Index(out, RaceReport)
			tb.Errorf("%s reported a data race:\n%s", name, out[i:min(len(out), i+8000)])
		}
	})
}
