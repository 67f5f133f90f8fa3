package spool

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
)

func rec(i int) Record {
	return Record{Time: int64(1_700_000_000_000 + i), Key: []byte(fmt.Sprintf("acct_%d", i%7)),
		Value: []byte(fmt.Sprintf(`{"event_id":"ev-%08d","pad":"%s"}`, i, bytes.Repeat([]byte("x"), i%50)))}
}

func open(t testing.TB, dir string, max, seg int64) *Spool {
	t.Helper()
	s, err := Open(Config{Dir: dir, MaxBytes: max, SegmentBytes: seg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func appendN(t testing.TB, s *Spool, from, n int) {
	t.Helper()
	recs := make([]Record, 0, n)
	for i := from; i < from+n; i++ {
		recs = append(recs, rec(i))
	}
	if w, err := s.Append(recs); err != nil || w != n {
		t.Fatalf("Append %d: wrote %d, %v", n, w, err)
	}
}

// readAll reads and acknowledges everything, checking each record against
// rec(i); it returns the indices read, in order.
func readAll(t testing.TB, s *Spool, batch int) []int {
	t.Helper()
	var got []int
	for {
		recs, pos, err := s.Read(batch, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			var i int
			if _, err := fmt.Sscanf(string(r.Value), `{"event_id":"ev-%08d"`, &i); err != nil {
				t.Fatalf("garbled record %q: %v", r.Value, err)
			}
			w := rec(i)
			if r.Time != w.Time || !bytes.Equal(r.Key, w.Key) || !bytes.Equal(r.Value, w.Value) {
				t.Fatalf("record %d came back changed: %+v", i, r)
			}
			got = append(got, i)
		}
		if err := s.Ack(pos); err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			return got
		}
	}
}

func segments(t testing.TB, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*.seg"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(m)
	return m
}

func seq(from, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Records come back oldest first across segments; a segment is deleted
// once all of it is acknowledged, and an emptied spool holds no segment.
func TestAppendReadAckAcrossSegments(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 1<<20, 4096)
	appendN(t, s, 0, 300)
	st := s.Stats()
	if st.Records != 300 || st.Oldest != rec(0).Time || len(segments(t, dir)) < 5 {
		t.Fatalf("after 300 appends: %+v, %d segments", st, len(segments(t, dir)))
	}
	before := len(segments(t, dir))
	for read := 0; read < 50; { // a Read stops at the end of a segment
		recs, pos, err := s.Read(50-read, 1<<20)
		if err != nil || len(recs) == 0 {
			t.Fatalf("Read: %d, %v", len(recs), err)
		}
		read += len(recs)
		if err := s.Ack(pos); err != nil {
			t.Fatal(err)
		}
	}
	if after := len(segments(t, dir)); after >= before {
		t.Fatalf("acknowledging 50 records deleted no segment (%d → %d)", before, after)
	}
	if st := s.Stats(); st.Records != 250 {
		t.Fatalf("after acking 50: %+v", st)
	}
	appendN(t, s, 300, 10) // appends while reading
	if got := readAll(t, s, 64); !equalInts(got, seq(50, 260)) {
		t.Fatalf("read %v", got)
	}
	if st := s.Stats(); st.Records != 0 || st.Bytes != 0 || st.Oldest != 0 || len(segments(t, dir)) != 0 {
		t.Fatalf("drained: %+v, segments %v", st, segments(t, dir))
	}
	appendN(t, s, 310, 3) // and the spool is usable again
	if got := readAll(t, s, 64); !equalInts(got, seq(310, 3)) {
		t.Fatalf("read %v", got)
	}
}

// What is not acknowledged comes back after a restart (read again,
// including what was read but not acknowledged), and appends after it go
// to a new segment.
func TestReopenReturnsWhatWasNotAcknowledged(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir, MaxBytes: 1 << 20, SegmentBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, s, 0, 100)
	for read := 0; read < 30; {
		recs, pos, _ := s.Read(30-read, 1<<20)
		if len(recs) == 0 {
			t.Fatal("nothing to read")
		}
		read += len(recs)
		s.Ack(pos)
	}
	s.Read(10, 1<<20) // read, never acknowledged
	if _, err := Open(Config{Dir: dir}); err == nil {
		t.Fatal("a second Open of a spool in use succeeded")
	}
	s.Close()
	nsegs := len(segments(t, dir))

	s = open(t, dir, 1<<20, 4096)
	rc := s.Recovered()
	if rc.Skipped != 0 || rc.Segments != nsegs || rc.Records < 70 {
		t.Fatalf("recovered %+v from %d segments", rc, nsegs)
	}
	appendN(t, s, 100, 5)
	if n := len(segments(t, dir)); n != nsegs+1 {
		t.Fatalf("after reopen, an append went to an old segment: %d segments, want %d", n, nsegs+1)
	}
	got := readAll(t, s, 7)
	// The records of the partly acknowledged segment come again; every
	// record not acknowledged comes, in order, once.
	if len(got) < 75 || got[len(got)-75] != 30 || !equalInts(got[len(got)-75:], seq(30, 75)) {
		t.Fatalf("read after reopen: %v", got)
	}
}

// writeSegment writes n records into one segment file and returns its path
// and the offset each record starts at.
func writeSegment(t testing.TB, dir string, n int) (string, []int) {
	t.Helper()
	s, err := Open(Config{Dir: dir, MaxBytes: 1 << 30, SegmentBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, s, 0, n)
	s.Close()
	segs := segments(t, dir)
	if len(segs) != 1 {
		t.Fatalf("%d segments", len(segs))
	}
	offs := []int{len(magic)}
	for i := 0; i < n; i++ {
		offs = append(offs, offs[i]+int(RecordSize(rec(i))))
	}
	return segs[0], offs
}

// A torn last record (the process killed within its write) is skipped,
// whatever byte it was cut at; the others come back intact.
func TestTornTailIsSkipped(t *testing.T) {
	const n = 20
	for _, cut := range []int{1, 4, hdrLen, hdrLen + 3, -1} {
		t.Run(fmt.Sprint(cut), func(t *testing.T) {
			dir := t.TempDir()
			path, offs := writeSegment(t, dir, n)
			end := offs[n-1] + cut
			if cut < 0 {
				end = offs[n] + cut // all but the last byte
			}
			if err := os.Truncate(path, int64(end)); err != nil {
				t.Fatal(err)
			}
			s := open(t, dir, 1<<20, 4096)
			if rc := s.Recovered(); rc.Records != n-1 || rc.Skipped != 1 || rc.SkippedBytes != int64(end-offs[n-1]) {
				t.Fatalf("recovered %+v", rc)
			}
			if got := readAll(t, s, 8); !equalInts(got, seq(0, n-1)) {
				t.Fatalf("read %v", got)
			}
			if len(segments(t, dir)) != 0 {
				t.Fatal("the torn segment was not deleted once read and acknowledged")
			}
		})
	}
}

// A flipped bit anywhere in a record (its length, its checksum, its
// payload) costs that record only: it is never returned changed.
func TestFlippedBitCostsOneRecord(t *testing.T) {
	const n, victim = 30, 11
	path, offs := func() (string, []int) { return writeSegment(t, t.TempDir(), n) }()
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for at := offs[victim]; at < offs[victim+1]; at += 3 {
		for _, bit := range []byte{0x01, 0x80} {
			dir := t.TempDir()
			b := bytes.Clone(orig)
			b[at] ^= bit
			if err := os.WriteFile(filepath.Join(dir, filepath.Base(path)), b, 0o600); err != nil {
				t.Fatal(err)
			}
			s := open(t, dir, 1<<20, 4096)
			got := readAll(t, s, 8)
			want := append(seq(0, victim), seq(victim+1, n-victim-1)...)
			if !equalInts(got, want) {
				t.Fatalf("bit %#x flipped at %d (record at %d): read %v", bit, at, offs[victim], got)
			}
			if rc := s.Recovered(); rc.Skipped != 1 {
				t.Fatalf("bit flipped at %d: recovered %+v", at, rc)
			}
			s.Close()
		}
	}
}

// Past the budget Append writes what fits and says ErrFull; acknowledging
// makes room again.
func TestBudget(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 8192, 2048)
	var recs []Record
	for i := 0; i < 500; i++ {
		recs = append(recs, rec(i))
	}
	w, err := s.Append(recs)
	if err != ErrFull || w == 0 || w == len(recs) {
		t.Fatalf("Append beyond the budget: wrote %d, %v", w, err)
	}
	if st := s.Stats(); st.Bytes > 8192 {
		t.Fatalf("spool holds %d bytes, budget 8192", st.Bytes)
	}
	if got := readAll(t, s, 16); !equalInts(got, seq(0, w)) {
		t.Fatalf("read %v", got)
	}
	if w2, err := s.Append(recs[w:]); err != ErrFull || w2 == 0 {
		t.Fatalf("Append after draining: wrote %d, %v", w2, err)
	}
	big := Record{Time: 1, Value: make([]byte, MaxRecord)}
	if _, err := s.Append([]Record{big}); err != ErrTooLarge {
		t.Fatalf("oversized record: %v", err)
	}
}

// Appenders on several goroutines and one reader: every record once.
func TestConcurrentAppendersOneReader(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 1<<30, 16<<10)
	const writers, each = 4, 2000
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i += 50 {
				appendN(t, s, w*each+i, 50)
			}
		}()
	}
	seen := map[int]bool{}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	finished := false
	for {
		got := readAll(t, s, 100)
		for _, i := range got {
			if seen[i] {
				t.Fatalf("record %d twice", i)
			}
			seen[i] = true
		}
		if finished {
			break
		}
		select {
		case <-done:
			finished = true
		case <-s.Appended():
		}
	}
	if len(seen) != writers*each {
		t.Fatalf("%d records read, want %d", len(seen), writers*each)
	}
}

// FuzzDamagedSegment: a segment cut short and with a byte changed anywhere
// yields only records that were written, unchanged, in order, once each;
// with no change, every whole record before the cut.
func FuzzDamagedSegment(f *testing.F) {
	f.Add(uint16(40), uint32(1000), uint32(200), byte(0x10))
	f.Add(uint16(5), uint32(7), uint32(3), byte(0))
	f.Add(uint16(60), uint32(1<<20), uint32(9), byte(0xff))
	f.Fuzz(func(t *testing.T, n uint16, cut, at uint32, xor byte) {
		n = n%80 + 1
		dir := t.TempDir()
		path, offs := writeSegment(t, dir, int(n))
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		b = b[:int(cut)%(len(b)+1)]
		if len(b) > 0 {
			b[int(at)%len(b)] ^= xor
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		s := open(t, dir, 1<<20, 4096)
		got := readAll(t, s, 9) // fails on a changed record
		for i := 1; i < len(got); i++ {
			if got[i] <= got[i-1] {
				t.Fatalf("out of order or twice: %v", got)
			}
		}
		if xor == 0 {
			whole := 0
			for whole < int(n) && offs[whole+1] <= len(b) {
				whole++
			}
			if !equalInts(got, seq(0, whole)) {
				t.Fatalf("cut at %d of %d: read %v, want the %d whole records", len(b), offs[n], got, whole)
			}
		}
	})
}
