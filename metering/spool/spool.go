// Package spool is a bounded, crash-safe queue of records on local disk:
// what the decision emitter keeps while Kafka does not take its writes.
//
// # Design
//
// A spool is a directory of segment files, 00000000000000000001.seg and
// up, each an 8-byte magic followed by records:
//
//	length uint32 LE | CRC-32C of the payload uint32 LE | payload
//	payload = time int64 LE (ms since the epoch) | uvarint key length | key | value
//
// Appends go to the newest segment (the head) with one write system call
// per call of Append, so a record is in the kernel's page cache, and
// survives the process being killed, as soon as Append returns; a segment
// is fsynced when it is full and when the spool is closed (a power loss
// can still take the head's last writes). A new segment is started when
// the head would pass SegmentBytes, and always after Open: nothing is ever
// appended behind a record that may be torn.
//
// One reader takes records oldest first (Read) and acknowledges them (Ack)
// once they are safe elsewhere; a segment is deleted only when every record
// in it has been acknowledged. Records read but not acknowledged when the
// process ends are read again by the next Open: a consumer of the spool
// must tolerate duplicates (decision events carry ids for exactly this).
//
// Open scans every segment and checks each record's length and checksum.
// A record that fails (the torn last write of a killed process, or a
// flipped bit) is skipped, never returned: the scan resumes at the next
// offset where a whole record with a matching checksum starts, so a flipped
// bit costs the one record it hit, and a torn tail costs only itself. Open
// reports what it skipped (Recovered).
//
// The byte budget (MaxBytes) counts segment files as they are on disk,
// including the acknowledged head of a segment not yet deleted; Append
// takes records while they fit and returns ErrFull for the rest.
//
// A lock file (flock) keeps a second process from opening the same
// directory. Append is safe for concurrent use, and with Read, Ack and
// Stats; Read and Ack belong to one reader goroutine.
package spool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

const (
	magic     = "RWSPOOL1"
	hdrLen    = 8       // length + checksum
	minRecord = 8 + 1   // time + a zero key length
	MaxRecord = 1 << 20 // the largest payload accepted: Kafka's default message size
	suffix    = ".seg"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrFull is returned by Append when the byte budget is spent.
var ErrFull = errors.New("spool: byte budget spent")

// ErrTooLarge is returned by Append for a record whose payload exceeds
// MaxRecord.
var ErrTooLarge = errors.New("spool: record too large")

// Config says where a spool lives and how large it may grow.
type Config struct {
	Dir string // required; created if missing
	// MaxBytes is the budget of the segment files together; default 1 GiB.
	MaxBytes int64
	// SegmentBytes is the size at which a new segment starts; default
	// MaxBytes/8, within [64 KiB, 8 MiB].
	SegmentBytes int64
}

// Record is one entry. Time is the record's own time in ms since the
// epoch (positive); Stats reports the oldest.
type Record struct {
	Time  int64
	Key   []byte
	Value []byte
}

// Position is a reader's place in the spool, as returned by Read.
type Position struct {
	seg uint64
	off int
	n   uint64 // records read since Open, up to here
}

// Stats is a spool's state.
type Stats struct {
	Bytes    int64 // segment files on disk
	MaxBytes int64
	Records  int64 // not yet acknowledged
	Oldest   int64 // Time of the oldest record not acknowledged (as far as read); 0 = empty
}

// Recovery is what Open found in the directory.
type Recovery struct {
	Segments int
	Records  int64 // valid records, to be read again
	// Skipped counts the damaged stretches passed over (each is at least
	// one record lost: a torn write or a corrupted one); SkippedBytes
	// their length.
	Skipped      int
	SkippedBytes int64
}

type segment struct {
	id     uint64
	path   string
	size   int64 // bytes in the file (= the readable end: records end at record boundaries or garbage is skipped)
	closed bool  // no more appends
	f      *os.File
}

// Spool is an open spool directory.
type Spool struct {
	cfg  Config
	lock *os.File

	mu      sync.Mutex
	segs    []*segment // oldest first; the last is the head when !closed
	nextID  uint64
	bytes   int64
	records int64
	oldest  int64
	ackN    uint64
	wbuf    []byte
	notify  chan struct{}
	// stats is what Stats returns, published under mu after every change:
	// Stats never waits for a write in progress (a slow disk must not
	// hang /metrics).
	stats atomic.Pointer[Stats]

	// The reader's state (one goroutine).
	rseg  uint64
	rf    *os.File
	rbuf  []byte
	roff  int
	rN    uint64
	rout  []Record
	recov Recovery
}

// Open opens (or creates) the spool in cfg.Dir, takes its lock and scans
// what an earlier process left.
func Open(cfg Config) (*Spool, error) {
	if cfg.Dir == "" {
		return nil, errors.New("spool: no directory")
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = 1 << 30
	}
	if cfg.SegmentBytes <= 0 {
		cfg.SegmentBytes = min(max(cfg.MaxBytes/8, 64<<10), 8<<20)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(cfg.Dir, "LOCK"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("spool: %s is in use by another process: %w", cfg.Dir, err)
	}
	s := &Spool{cfg: cfg, lock: lock, nextID: 1, notify: make(chan struct{}, 1)}
	if err := s.recover(); err != nil {
		lock.Close()
		return nil, err
	}
	s.publishLocked()
	return s, nil
}

// recover scans the segments left in the directory.
func (s *Spool) recover() error {
	ents, err := os.ReadDir(s.cfg.Dir)
	if err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	var buf []byte
	for _, e := range ents {
		name := e.Name()
		if !strings.HasSuffix(name, suffix) {
			continue
		}
		id, err := strconv.ParseUint(strings.TrimSuffix(name, suffix), 10, 64)
		if err != nil || id == 0 {
			continue
		}
		path := filepath.Join(s.cfg.Dir, name)
		if buf, err = readFile(path, buf); err != nil {
			return fmt.Errorf("spool: %w", err)
		}
		seg := &segment{id: id, path: path, size: int64(len(buf)), closed: true}
		n, skipped, skippedBytes, first := scanAll(buf)
		s.recov.Segments++
		s.recov.Records += n
		s.recov.Skipped += skipped
		s.recov.SkippedBytes += skippedBytes
		if s.oldest == 0 && first > 0 {
			s.oldest = first
		}
		s.segs = append(s.segs, seg)
		s.bytes += seg.size
		s.records += n
		s.nextID = max(s.nextID, id+1)
	}
	slices.SortFunc(s.segs, func(a, b *segment) int { return cmpU64(a.id, b.id) })
	if len(s.segs) > 0 {
		s.rseg = s.segs[0].id
	}
	return nil
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func readFile(path string, buf []byte) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return buf, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return buf, err
	}
	buf = slices.Grow(buf[:0], int(st.Size()))[:st.Size()]
	_, err = f.ReadAt(buf, 0)
	return buf, err
}

// scanAll counts the valid records of a segment's bytes and the damaged
// stretches between them, and returns the first record's Time.
func scanAll(b []byte) (records int64, skipped int, skippedBytes int64, first int64) {
	off := 0
	if len(b) >= len(magic) && string(b[:len(magic)]) == magic {
		off = len(magic)
	}
	// Otherwise not a segment's start (or torn within the magic): every
	// record that can still be found is kept.
	for off < len(b) {
		r, next, ok := decodeAt(b, off)
		if !ok {
			to := resync(b, off+1)
			skipped++
			skippedBytes += int64(to - off)
			off = to
			continue
		}
		if first == 0 {
			first = r.Time
		}
		records++
		off = next
	}
	return records, skipped, skippedBytes, first
}

// decodeAt decodes the record at off; ok is false when no whole record
// with a matching checksum starts there.
func decodeAt(b []byte, off int) (r Record, next int, ok bool) {
	if len(b)-off < hdrLen {
		return r, 0, false
	}
	n := int(binary.LittleEndian.Uint32(b[off:]))
	if n < minRecord || n > MaxRecord || n > len(b)-off-hdrLen {
		return r, 0, false
	}
	p := b[off+hdrLen : off+hdrLen+n]
	if crc32.Checksum(p, castagnoli) != binary.LittleEndian.Uint32(b[off+4:]) {
		return r, 0, false
	}
	t := int64(binary.LittleEndian.Uint64(p))
	kl, m := binary.Uvarint(p[8:])
	if t <= 0 || m <= 0 || kl > uint64(n-8-m) {
		return r, 0, false
	}
	k := p[8+m : 8+m+int(kl)]
	return Record{Time: t, Key: k[:len(k):len(k)], Value: p[8+m+int(kl):]}, off + hdrLen + n, true
}

// resync returns the first offset from off on where a valid record starts,
// or len(b).
func resync(b []byte, off int) int {
	for ; off < len(b); off++ {
		if _, _, ok := decodeAt(b, off); ok {
			return off
		}
	}
	return len(b)
}

func appendRecord(dst []byte, r Record) []byte {
	n := 8 + uvarintLen(uint64(len(r.Key))) + len(r.Key) + len(r.Value)
	start := len(dst)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(n))
	dst = append(dst, 0, 0, 0, 0)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(r.Time))
	dst = binary.AppendUvarint(dst, uint64(len(r.Key)))
	dst = append(dst, r.Key...)
	dst = append(dst, r.Value...)
	binary.LittleEndian.PutUint32(dst[start+4:], crc32.Checksum(dst[start+hdrLen:], castagnoli))
	return dst
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// RecordSize is the bytes rec takes on disk.
func RecordSize(r Record) int64 {
	return int64(hdrLen + 8 + uvarintLen(uint64(len(r.Key))) + len(r.Key) + len(r.Value))
}

// Recovered is what Open found.
func (s *Spool) Recovered() Recovery { return s.recov }

// Appended is signalled (without blocking, capacity one) after every
// Append that wrote records: the reader waits on it when Read finds
// nothing.
func (s *Spool) Appended() <-chan struct{} { return s.notify }

// Append writes recs, in order, while they fit within the budget, and
// returns how many it wrote. The error is ErrFull (budget spent: the rest
// was not written), ErrTooLarge (the first record not written exceeds
// MaxRecord) or a write error (the rest was not written, and the head
// segment is abandoned: later appends start a new one).
func (s *Spool) Append(recs []Record) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.publishLocked()
	written := 0
	var err error
	for written < len(recs) && err == nil {
		var n int
		n, err = s.appendLocked(recs[written:])
		written += n
	}
	if written > 0 {
		select {
		case s.notify <- struct{}{}:
		default:
		}
	}
	return written, err
}

// appendLocked writes a prefix of recs into the head (one segment), and
// returns how many; err is nil when the rest only needs the next segment.
func (s *Spool) appendLocked(recs []Record) (int, error) {
	head, err := s.headLocked()
	if err != nil {
		return 0, err
	}
	s.wbuf = s.wbuf[:0]
	n := 0
	full := false
	var stop error
	for _, r := range recs {
		size := RecordSize(r)
		if size-hdrLen > MaxRecord {
			stop = ErrTooLarge
			break
		}
		if s.bytes+int64(len(s.wbuf))+size > s.cfg.MaxBytes {
			stop = ErrFull
			break
		}
		if head.size+int64(len(s.wbuf))+size > s.cfg.SegmentBytes && (head.size > int64(len(magic)) || len(s.wbuf) > 0) {
			full = true
			break
		}
		s.wbuf = appendRecord(s.wbuf, r)
		if s.records == 0 && n == 0 {
			s.oldest = r.Time
		}
		n++
	}
	if len(s.wbuf) > 0 {
		if _, werr := head.f.Write(s.wbuf); werr != nil {
			// What reached the file may end in a torn record: abandon
			// the head (its readable end stays where it was) and count
			// none of this write as spooled.
			s.abandonLocked(head)
			return 0, fmt.Errorf("spool: write %s: %w", head.path, werr)
		}
		head.size += int64(len(s.wbuf))
		s.bytes += int64(len(s.wbuf))
		s.records += int64(n)
	}
	if full {
		s.closeHeadLocked(head)
	}
	return n, stop
}

// headLocked returns the segment appends go to, creating it when needed.
func (s *Spool) headLocked() (*segment, error) {
	if len(s.segs) > 0 && !s.segs[len(s.segs)-1].closed {
		return s.segs[len(s.segs)-1], nil
	}
	if s.bytes+int64(len(magic)) > s.cfg.MaxBytes {
		return nil, ErrFull
	}
	id := s.nextID
	path := filepath.Join(s.cfg.Dir, fmt.Sprintf("%020d%s", id, suffix))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	if _, err := f.Write([]byte(magic)); err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("spool: %w", err)
	}
	s.nextID++
	// The reader's place (rseg) is the reader's alone: it finds this
	// segment as the oldest after its own (ids only grow).
	seg := &segment{id: id, path: path, size: int64(len(magic)), f: f}
	s.segs = append(s.segs, seg)
	s.bytes += seg.size
	return seg, nil
}

func (s *Spool) closeHeadLocked(seg *segment) {
	seg.closed = true
	if seg.f != nil {
		_ = seg.f.Sync()
		_ = seg.f.Close()
		seg.f = nil
	}
}

func (s *Spool) abandonLocked(seg *segment) {
	if st, err := seg.f.Stat(); err == nil && st.Size() > seg.size {
		// The file may hold part of the write: the reader's checksums
		// skip a torn record (whole ones of that write are read, and
		// sent, though Append said they were not written).
		s.bytes += st.Size() - seg.size
		seg.size = st.Size()
	}
	s.closeHeadLocked(seg)
}

// Read returns up to maxRecords records, at most maxBytes of payload (but
// at least one record), oldest first, after those of the previous Read, and
// the position to acknowledge them with. The records' bytes are valid until
// the next Read. No records with a position: nothing to read now (the
// position may still be worth acknowledging: damaged bytes it passed).
func (s *Spool) Read(maxRecords, maxBytes int) ([]Record, Position, error) {
	s.rout = s.rout[:0]
	bytes := 0
	for len(s.rout) < maxRecords && bytes < maxBytes {
		s.mu.Lock()
		seg := s.segmentLocked(s.rseg)
		var size int64
		var closed bool
		var next uint64
		if seg != nil {
			size, closed = seg.size, seg.closed
			if i := s.indexLocked(seg.id); i+1 < len(s.segs) {
				next = s.segs[i+1].id
			}
		}
		s.mu.Unlock()
		if seg == nil {
			break
		}
		if s.rf == nil {
			if len(s.rout) > 0 {
				break // opening the next segment reuses the bytes of what is returned
			}
			f, err := os.Open(seg.path)
			if err != nil {
				return nil, s.pos(), fmt.Errorf("spool: %w", err)
			}
			s.rf, s.rbuf, s.roff = f, s.rbuf[:0], len(magic)
		}
		if int64(len(s.rbuf)) < size {
			old := len(s.rbuf)
			if len(s.rout) > 0 {
				break // loading more would move the bytes of what is returned
			}
			s.rbuf = slices.Grow(s.rbuf, int(size)-old)[:size]
			if _, err := s.rf.ReadAt(s.rbuf[old:], int64(old)); err != nil {
				s.rbuf = s.rbuf[:old]
				return nil, s.pos(), fmt.Errorf("spool: read %s: %w", seg.path, err)
			}
			if old == 0 && (len(s.rbuf) < len(magic) || string(s.rbuf[:len(magic)]) != magic) {
				s.roff = 0
			}
		}
		for s.roff < len(s.rbuf) && len(s.rout) < maxRecords && bytes < maxBytes {
			r, nx, ok := decodeAt(s.rbuf, s.roff)
			if !ok {
				s.roff = resync(s.rbuf, s.roff+1) // counted by Open
				continue
			}
			s.rout = append(s.rout, r)
			bytes += len(r.Key) + len(r.Value)
			s.roff = nx
			s.rN++
		}
		if s.roff < len(s.rbuf) || !closed || next == 0 {
			break
		}
		// This segment is read to its end: on to the next.
		s.rf.Close()
		s.rf = nil
		s.rseg, s.roff = next, 0 // a position at 0: nothing of next read yet
	}
	if len(s.rout) > 0 {
		s.mu.Lock()
		if s.ackN == s.rN-uint64(len(s.rout)) {
			s.oldest = s.rout[0].Time
			s.publishLocked()
		}
		s.mu.Unlock()
	}
	return s.rout, s.pos(), nil
}

func (s *Spool) pos() Position { return Position{seg: s.rseg, off: s.roff, n: s.rN} }

func (s *Spool) segmentLocked(id uint64) *segment {
	if i := s.indexLocked(id); i >= 0 {
		return s.segs[i]
	}
	// The reader's segment is gone (acknowledged) or not yet made: the
	// oldest one after it.
	for _, seg := range s.segs {
		if seg.id > id {
			s.rseg = seg.id
			return seg
		}
	}
	return nil
}

func (s *Spool) indexLocked(id uint64) int {
	for i, seg := range s.segs {
		if seg.id == id {
			return i
		}
	}
	return -1
}

// Ack acknowledges every record up to p (from Read): segments all of whose
// records are acknowledged are deleted.
func (s *Spool) Ack(p Position) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.publishLocked()
	if p.n > s.ackN {
		s.records -= int64(p.n - s.ackN)
		s.ackN = p.n
	}
	var errs []error
	keep := s.segs[:0]
	for _, seg := range s.segs {
		done := seg.id < p.seg || (seg.id == p.seg && int64(p.off) >= seg.size)
		if !done {
			keep = append(keep, seg)
			continue
		}
		if seg.id == s.rseg && s.rf != nil {
			s.rf.Close()
			s.rf = nil
		}
		s.closeHeadLocked(seg)
		if err := os.Remove(seg.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		s.bytes -= seg.size
	}
	clear(s.segs[len(keep):])
	s.segs = keep
	if s.records <= 0 {
		s.records, s.oldest = 0, 0
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("spool: delete: %w", err)
	}
	return nil
}

// Stats returns the spool's state as of the last change; it never waits
// for a write in progress.
func (s *Spool) Stats() Stats { return *s.stats.Load() }

func (s *Spool) publishLocked() {
	s.stats.Store(&Stats{Bytes: s.bytes, MaxBytes: s.cfg.MaxBytes, Records: s.records, Oldest: s.oldest})
}

// Close syncs and closes the head segment and releases the directory.
// What is not acknowledged stays for the next Open.
func (s *Spool) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, seg := range s.segs {
		s.closeHeadLocked(seg)
	}
	if s.rf != nil {
		s.rf.Close()
		s.rf = nil
	}
	return s.lock.Close()
}
