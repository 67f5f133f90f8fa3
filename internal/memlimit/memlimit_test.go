package memlimit

import (
	"testing"
	"testing/fstest"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func file(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }

func TestChoose(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name   string
		fs     fstest.MapFS
		env    map[string]string
		want   Choice
		hasErr bool
	}{
		{
			name: "cgroup v2 in its namespace",
			fs: fstest.MapFS{
				"proc/self/cgroup":         file("0::/\n"),
				"sys/fs/cgroup/memory.max": file("536870912\n"),
			},
			want: Choice{Limit: 512 * mib * 9 / 10, Container: 512 * mib, Source: "/sys/fs/cgroup/memory.max"},
		},
		{
			name: "cgroup v2 nested, the tightest ancestor wins",
			fs: fstest.MapFS{
				"proc/self/cgroup":                           file("0::/kubepods/pod1/ctr\n"),
				"sys/fs/cgroup/kubepods/pod1/ctr/memory.max": file("max\n"),
				"sys/fs/cgroup/kubepods/pod1/memory.max":     file("268435456\n"),
				"sys/fs/cgroup/kubepods/memory.max":          file("1073741824\n"),
				"sys/fs/cgroup/memory.max":                   file("max\n"),
			},
			want: Choice{Limit: 256 * mib * 9 / 10, Container: 256 * mib, Source: "/sys/fs/cgroup/kubepods/pod1/memory.max"},
		},
		{
			name: "cgroup v1",
			fs: fstest.MapFS{
				"proc/self/cgroup": file("12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc\n"),
				"sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": file("134217728\n"),
			},
			want: Choice{Limit: 128 * mib * 9 / 10, Container: 128 * mib, Source: "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes"},
		},
		{
			name: "cgroup v1 unlimited",
			fs: fstest.MapFS{
				"proc/self/cgroup":                           file("11:memory:/\n"),
				"sys/fs/cgroup/memory/memory.limit_in_bytes": file("9223372036854771712\n"),
			},
			want: Choice{},
		},
		{
			name: "no limit",
			fs: fstest.MapFS{
				"proc/self/cgroup":         file("0::/user.slice\n"),
				"sys/fs/cgroup/memory.max": file("max\n"),
			},
			want: Choice{},
		},
		{
			name: "no cgroup file system at all",
			fs:   fstest.MapFS{},
			want: Choice{},
		},
		{
			name: "the user's GOMEMLIMIT is left alone",
			fs: fstest.MapFS{
				"proc/self/cgroup":         file("0::/\n"),
				"sys/fs/cgroup/memory.max": file("536870912\n"),
			},
			env:  map[string]string{"GOMEMLIMIT": "300MiB"},
			want: Choice{Container: 512 * mib, Source: "GOMEMLIMIT"},
		},
		{
			name: "garbage is an error, and no limit",
			fs: fstest.MapFS{
				"proc/self/cgroup":         file("0::/\n"),
				"sys/fs/cgroup/memory.max": file("lots\n"),
			},
			want:   Choice{},
			hasErr: true,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Choose(c.fs, env(c.env))
			if (err != nil) != c.hasErr {
				t.Fatalf("error %v, want one: %v", err, c.hasErr)
			}
			if got != c.want {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}
