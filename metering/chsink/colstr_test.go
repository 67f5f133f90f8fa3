package chsink

import (
	"slices"
	"strings"
	"testing"
)

// A sized column is a column of decisions_raw that no rollup has: a
// rollup's column of the same name would be given decisions_raw's room.
func TestSizedColumnsAreRawOnly(t *testing.T) {
	names := func(cols string) []string { return strings.Split(cols, ", ") }
	raw := names(rawColumns)
	others := slices.Concat(names(rollupColumns+regionColumn), names(shadowHourColumns), names(rolloutShadowColumns))
	for _, name := range sizedColumns {
		if !slices.Contains(raw, name) {
			t.Errorf("%s is not a column of decisions_raw", name)
		}
		if slices.Contains(others, name) {
			t.Errorf("%s is a rollup's column too", name)
		}
	}
}

// insert's record of a column's values sizes the next column of that name,
// and only of a sized name.
func TestExpectColumnSizesTheNextColumn(t *testing.T) {
	trace := "4bf92f3577b34da6a3ce929d0e0e4736"
	expectColumn("source", []string{"shared", "local", ""})
	expectColumn("trace_id", []*string{nil, &trace})
	expectColumn("key", []string{"k"})
	if c := sizedColStr("source"); cap(c.Buf) != len("sharedlocal") || cap(c.Pos) != 3 || len(c.Buf) != 0 || len(c.Pos) != 0 {
		t.Errorf("source: len %d/%d, cap %d/%d", len(c.Buf), len(c.Pos), cap(c.Buf), cap(c.Pos))
	}
	if c := sizedColStr("trace_id"); cap(c.Buf) != len(trace) || cap(c.Pos) != 2 {
		t.Errorf("trace_id: cap %d/%d", cap(c.Buf), cap(c.Pos))
	}
	if c := sizedColStr("key"); c.Buf != nil || c.Pos != nil {
		t.Errorf("key was sized: cap %d/%d", cap(c.Buf), cap(c.Pos))
	}
}
