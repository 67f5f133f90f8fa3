package chsink

import (
	"strings"
	"testing"

	"github.com/ratewarden/ratewarden/metering"
)

// An INSERT names the columns every event needs and the optional ones
// that some event of its batch uses, each beside its own values.
func TestColumnsLeaveOutWhatNoEventUses(t *testing.T) {
	values := make([]any, len(rawNames))
	for i := range values {
		values[i] = i
	}
	o := optionalOf(&metering.Event{Region: "eu"}) | optionalOf(&metering.Event{Kind: metering.KindCharge})
	names, kept := o.columns(append([]any(nil), values...))
	got := strings.Split(names, ", ")
	if len(got) != len(kept) {
		t.Fatalf("%d names, %d columns of values", len(got), len(kept))
	}
	for i, name := range got {
		if rawNames[kept[i].(int)] != name {
			t.Errorf("column %s holds the values of %s", name, rawNames[kept[i].(int)])
		}
	}
	want := rawColumns[:strings.Index(rawColumns, ", domain")] + ", region, kind, actual_cost"
	if names != want {
		t.Errorf("columns\n%s\nwant\n%s", names, want)
	}
	if all, _ := optional(1<<len(optionalColumns) - 1).columns(values); all != rawColumns {
		t.Errorf("every optional column used: %s", all)
	}
}
