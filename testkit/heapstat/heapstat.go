// Package heapstat is the one way the heap benchmarks measure what a
// structure holds: the live heap after full collections, before and after
// it is built.
package heapstat

import "runtime"

// Live is the heap still allocated after two full collections (the second
// frees what finalizers of the first released).
func Live() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
