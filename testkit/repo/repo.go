// Package repo finds, for tests that read the repository itself (its docs,
// its import graph), the repository's top directory and the go tool.
package repo

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// Root is the repository's top directory: the nearest directory above the
// test's working directory (its package's folder) that holds go.mod.
func Root(tb testing.TB) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			tb.Fatalf("no go.mod above %s", dir)
		}
	}
}

// GoTool is the go command: the one on PATH, else GOROOT's.
func GoTool(tb testing.TB) string {
	tb.Helper()
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	p := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(p); err != nil {
		tb.Fatalf("no go tool in PATH or GOROOT: %v", err)
	}
	return p
}
