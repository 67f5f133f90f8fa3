package chsink

import (
	"sync/atomic"

	"github.com/ClickHouse/ch-go/proto"
	"github.com/ClickHouse/clickhouse-go/v2/lib/column"
)

// clickhouse-go builds every String column of an INSERT from empty and
// appends one value at a time, so its values and 16-byte row positions
// are copied again each time they outgrow their room:
// most of what the sink allocated. Its one hook is process-wide, a
// provider of the empty column by column name (column.WithColStrProvider),
// so the sink sizes only columns whose name no rollup shares (a rollup's
// key column holds a row per key and minute, not per event): insert
// records the rows and bytes of such a column just before it prepares
// the INSERT. INSERTs of several partitions run at once, so a column may
// get another's size: one sized too small grows as before, one sized too
// large (or another table's column of the same name, such as a webhook
// delivery's event_id) costs one allocation of that size.

// sizedColumns are the String columns of decisions_raw that no rollup
// has (event_id is event_ids' too, with the same rows).
var sizedColumns = []string{"event_id", "source", "policy", "instance", "domain", "reservation", "trace_id"}

// colSize is the room the next column of a name is given.
type colSize struct{ rows, bytes atomic.Int64 }

var colSizes = map[string]*colSize{} // read-only after init

// init installs the provider: clickhouse-go reads it without a lock from
// every connection's goroutines, so it is set before any exists. Until a
// sink records a size, every column is clickhouse-go's default, so a
// process that writes no events sees no change.
func init() {
	for _, name := range sizedColumns {
		colSizes[name] = &colSize{}
	}
	column.WithColStrProvider(sizedColStr)
}

func sizedColStr(name string) proto.ColStr {
	s := colSizes[name]
	if s == nil {
		return proto.ColStr{}
	}
	rows, bytes := s.rows.Load(), s.bytes.Load()
	if rows == 0 {
		return proto.ColStr{}
	}
	return proto.ColStr{Buf: make([]byte, 0, bytes), Pos: make([]proto.Position, 0, rows)}
}

// expectColumn records the rows and bytes of values, about to be
// appended to a column of name.
func expectColumn(name string, values any) {
	s := colSizes[name]
	if s == nil {
		return
	}
	rows, bytes := 0, 0
	switch v := values.(type) {
	case []string:
		rows = len(v)
		for _, x := range v {
			bytes += len(x)
		}
	case []*string: // Nullable(String)
		rows = len(v)
		for _, x := range v {
			if x != nil {
				bytes += len(*x)
			}
		}
	default:
		return
	}
	s.rows.Store(int64(rows))
	s.bytes.Store(int64(bytes))
}
