// Package memlimit gives the Go runtime a soft memory limit below the
// container's: when a cgroup memory limit is visible (cgroup v2
// memory.max, cgroup v1 memory.limit_in_bytes) and the user has not set
// GOMEMLIMIT, the limit becomes Fraction of it. The collector then works
// harder as the heap nears the container's limit instead of letting the
// kernel's OOM killer end the process: a limiter whose protection becomes
// the outage is the failure this prevents.
//
// The cgroup files are read here rather than through a library: the
// module that does this job (automemlimit) is not among the ones this
// project may use, and what is needed is two files and one line of
// /proc/self/cgroup.
package memlimit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"runtime/debug"
	"strconv"
	"strings"
)

// Fraction is the share of the container's limit given to the runtime: the
// rest is for what the runtime does not count (thread stacks, the binary,
// memory returned to the kernel lazily).
const Fraction = 0.9

// Choice is what Choose decided.
type Choice struct {
	// Limit is the soft memory limit to set, in bytes; 0 = none.
	Limit int64
	// Container is the container's memory limit, in bytes; 0 = none visible.
	Container int64
	// Source says where the limit comes from: "GOMEMLIMIT" (the user's
	// own, left as it is), the cgroup file read, or "" (none visible).
	Source string
}

// Choose reads the container's memory limit from fsys, a file system
// rooted at "/" (os.DirFS("/") in production), and decides the runtime's
// soft limit. GOMEMLIMIT set in getenv wins: nothing is to be set then,
// but the container's limit is still reported.
func Choose(fsys fs.FS, getenv func(string) string) (Choice, error) {
	limit, file, err := containerLimit(fsys)
	c := Choice{Container: limit}
	if v := strings.TrimSpace(getenv("GOMEMLIMIT")); v != "" {
		c.Source = "GOMEMLIMIT"
		return c, nil
	}
	if err != nil {
		return c, err
	}
	if limit > 0 {
		c.Limit, c.Source = int64(float64(limit)*Fraction), file
	}
	return c, nil
}

// Apply is Choose, then debug.SetMemoryLimit when there is a limit to set.
func Apply(fsys fs.FS, getenv func(string) string) (Choice, error) {
	c, err := Choose(fsys, getenv)
	if c.Limit > 0 {
		debug.SetMemoryLimit(c.Limit)
	}
	return c, err
}

// containerLimit is the tightest memory limit of this process's cgroup and
// its ancestors, and the file it was read from; 0 when none is set.
func containerLimit(fsys fs.FS) (int64, string, error) {
	v1, v2, err := cgroupPaths(fsys)
	if err != nil {
		return 0, "", err
	}
	var candidates []string
	if v2 != "" {
		for _, dir := range ancestors(v2) {
			candidates = append(candidates, path.Join("sys/fs/cgroup", dir, "memory.max"))
		}
	}
	if v1 != "" {
		for _, dir := range ancestors(v1) {
			candidates = append(candidates, path.Join("sys/fs/cgroup/memory", dir, "memory.limit_in_bytes"))
		}
	}
	var best int64
	var from string
	var errs []error
	for _, name := range candidates {
		raw, err := fs.ReadFile(fsys, name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		n, ok, err := parseLimit(raw)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", "/"+name, err))
			continue
		}
		if ok && (best == 0 || n < best) {
			best, from = n, "/"+name
		}
	}
	return best, from, errors.Join(errs...)
}

// cgroupPaths reads /proc/self/cgroup: the v1 memory controller's path and
// the v2 (unified) path, each empty when absent. Inside a container's
// cgroup namespace both are "/". With no /proc/self/cgroup the root
// files are looked at.
func cgroupPaths(fsys fs.FS) (v1, v2 string, err error) {
	raw, err := fs.ReadFile(fsys, "proc/self/cgroup")
	if errors.Is(err, fs.ErrNotExist) {
		return "/", "/", nil
	}
	if err != nil {
		return "", "", err
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case hasController(parts[1], "memory"):
			v1 = parts[2]
		}
	}
	return v1, v2, sc.Err()
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// ancestors lists dir and each of its parents up to "/", deepest first.
func ancestors(dir string) []string {
	dir = path.Clean("/" + dir)
	out := []string{dir}
	for dir != "/" {
		dir = path.Dir(dir)
		out = append(out, dir)
	}
	return out
}

// unlimitedV1 is at or above what cgroup v1 reports for "no limit"
// (the largest page-aligned int64, 9223372036854771712).
const unlimitedV1 = 1 << 62

// parseLimit reads a memory.max or memory.limit_in_bytes value: ok false
// for "max" or v1's unlimited.
func parseLimit(raw []byte) (n int64, ok bool, err error) {
	s := strings.TrimSpace(string(raw))
	if s == "max" {
		return 0, false, nil
	}
	n, err = strconv.ParseInt(s, 10, 64)
	if err != nil {
		u, uerr := strconv.ParseUint(s, 10, 64)
		if uerr == nil && u >= unlimitedV1 {
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("not a memory limit: %q", s)
	}
	if n <= 0 || n >= unlimitedV1 {
		return 0, false, nil
	}
	return n, true, nil
}
