package ratelimitheader

import (
	"encoding/json"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"

	"github.com/ratewarden/ratewarden/enforcement"
)

var now = time.Date(2026, 11, 14, 12, 0, 0, 0, time.UTC)

// parseList parses v with an independent implementation of the RFC 9651
// grammar (github.com/dunglas/httpsfv), failing the test on any error.
func parseList(t *testing.T, v string) httpsfv.List {
	t.Helper()
	l, err := httpsfv.UnmarshalList([]string{v})
	if err != nil {
		t.Fatalf("%q is not an RFC 9651 List: %v", v, err)
	}
	return l
}

// item is one parsed list member: its String value and its parameters in
// the order they were written.
type item struct {
	name   string
	keys   []string
	params map[string]int64
}

func items(t *testing.T, v string) []item {
	t.Helper()
	var out []item
	for i, m := range parseList(t, v) {
		it, ok := m.(httpsfv.Item)
		if !ok {
			t.Fatalf("%q member %d is %T, want an Item", v, i, m)
		}
		name, ok := it.Value.(string)
		if !ok {
			t.Fatalf("%q member %d's value is %T, want a String (the draft: the Item value MUST be a String)", v, i, it.Value)
		}
		got := item{name: name, params: map[string]int64{}}
		for _, k := range it.Params.Names() {
			pv, _ := it.Params.Get(k)
			n, ok := pv.(int64)
			if !ok {
				t.Fatalf("%q parameter %s is %T, want an Integer", v, k, pv)
			}
			got.keys = append(got.keys, k)
			got.params[k] = n
		}
		out = append(out, got)
	}
	return out
}

func bucketDecision() enforcement.Decision {
	return enforcement.Decision{
		Allowed: true, WouldAllow: true, Policy: "pro", Cost: 1,
		Limit: 200, Remaining: 57, ResetAt: now.Add(1430 * time.Millisecond),
		Bucket: enforcement.BucketState{Rate: 100, Burst: 200, Remaining: 57, ResetAt: now.Add(1430 * time.Millisecond)},
	}
}

func TestBucketFields(t *testing.T) {
	d := bucketDecision()
	pol := string(AppendPolicy(nil, &d, now))
	rl := string(AppendRateLimit(nil, &d, now))
	if pol != `"pro";q=200;w=2` || rl != `"pro";r=57;t=2` {
		t.Fatalf("RateLimit-Policy %s, RateLimit %s", pol, rl)
	}
	p := items(t, pol)
	if len(p) != 1 || p[0].name != "pro" || p[0].params["q"] != 200 || p[0].params["w"] != 2 ||
		strings.Join(p[0].keys, ",") != "q,w" {
		t.Fatalf("parsed policy %+v", p)
	}
	r := items(t, rl)
	if len(r) != 1 || r[0].name != "pro" || strings.Join(r[0].keys, ",") != "r,t" || r[0].params["r"] != 57 {
		t.Fatalf("parsed ratelimit %+v", r)
	}
}

// The window is an empty bucket's refill time, rounded up and never 0.
func TestBucketWindow(t *testing.T) {
	for _, tc := range []struct {
		rate  float64
		burst int64
		want  int64
	}{
		{100, 200, 2},
		{1.0 / 3600, 5, 18000},       // 1 an hour, burst 5
		{1000, 10, 1},                // 10 ms to refill: w is at least 1
		{3, 10, 4},                   // 3.33 s rounds up
		{1e-30, 1 << 62, maxInteger}, // beyond the sf-integer range: clamped
		{0, 10, maxInteger},
	} {
		if got := bucketWindow(&enforcement.BucketState{Rate: tc.rate, Burst: tc.burst}); got != tc.want {
			t.Errorf("rate %v burst %d: w = %d, want %d", tc.rate, tc.burst, got, tc.want)
		}
	}
}

// A calendar quota is a second item of both fields; t is the time to the
// window's end and w the window's own length.
func TestQuotaItem(t *testing.T) {
	d := bucketDecision()
	end := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	d.Quota = enforcement.QuotaState{Limit: 100_000_000, Period: enforcement.PeriodMonth, Known: true, Remaining: 99_000_000, ResetAt: end}
	pol := string(AppendPolicy(nil, &d, now))
	if want := `"pro";q=200;w=2, "pro-quota";q=100000000;w=2592000`; pol != want { // November: 30 days
		t.Fatalf("policy %s, want %s", pol, want)
	}
	rl := string(AppendRateLimit(nil, &d, now))
	if want := `"pro";r=57;t=2, "pro-quota";r=99000000;t=1425600`; rl != want {
		t.Fatalf("ratelimit %s, want %s", rl, want)
	}
	if p := items(t, pol); len(p) != 2 || p[1].name != "pro-quota" || p[1].params["w"] != 30*86400 {
		t.Fatalf("parsed %+v", p)
	}
	if r := items(t, rl); len(r) != 2 || r[1].params["t"] != int64(end.Sub(now)/time.Second) {
		t.Fatalf("parsed %+v", r)
	}

	// A quota whose spend the local tier did not know yet: advertised as a
	// policy, with no service limit.
	d.Quota.Known, d.Quota.Remaining, d.Quota.ResetAt = false, 0, time.Time{}
	if pol := string(AppendPolicy(nil, &d, now)); !strings.Contains(pol, `"pro-quota";q=100000000;w=2592000`) {
		t.Fatalf("policy %s", pol)
	}
	if rl := string(AppendRateLimit(nil, &d, now)); rl != `"pro";r=57;t=2` {
		t.Fatalf("ratelimit %s", rl)
	}
}

// On a rejection, the items that refused carry t = Retry-After (section 6:
// Retry-After is never earlier than the end of their effective window);
// an item that could have paid keeps its own t.
func TestRejectionCapsTOfWhatRefused(t *testing.T) {
	d := bucketDecision()
	d.Allowed, d.WouldAllow, d.Cost = false, false, 10
	d.Bucket.Remaining, d.Remaining = 3, 3
	d.RetryAfter = 70 * time.Millisecond
	d.Quota = enforcement.QuotaState{Limit: 1000, Period: enforcement.PeriodDay, Known: true, Remaining: 500, ResetAt: now.Add(12 * time.Hour)}
	rl := string(AppendRateLimit(nil, &d, now))
	if want := `"pro";r=3;t=1, "pro-quota";r=500;t=43200`; rl != want {
		t.Fatalf("ratelimit %s, want %s", rl, want)
	}
	if v := string(AppendViolated(nil, &d)); v != `["pro"]` {
		t.Fatalf("violated %s", v)
	}

	// The quota refused: its t is the Retry-After, the window's end.
	d.Bucket.Remaining, d.Quota.Remaining = 150, 4
	d.RetryAfter = 12 * time.Hour
	if rl := string(AppendRateLimit(nil, &d, now)); rl != `"pro";r=150;t=2, "pro-quota";r=4;t=43200` {
		t.Fatalf("ratelimit %s", rl)
	}
	var names []string
	if err := json.Unmarshal(AppendViolated(nil, &d), &names); err != nil || len(names) != 1 || names[0] != "pro-quota" {
		t.Fatalf("violated %v %v", names, err)
	}
}

// RFC 9651 section 3.3.3: an sf-string is printable ASCII with '"' and '\'
// escaped. Names outside that range are percent-encoded (and '%' itself),
// so every name serialises to a valid field and the name is recoverable.
func TestStringRule(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{`plain-rule_1.x`, `"plain-rule_1.x"`},
		{`say "hi"`, `"say \"hi\""`},
		{`back\slash`, `"back\\slash"`},
		{`50%`, `"50%25"`},
		{"café", `"caf%C3%A9"`},
		{"tab\there\nnl", `"tab%09here%0Anl"`},
		{"del\x7f", `"del%7F"`},
		{"", `""`},
		{"~ !#$&'()*+,-./:;<=>?@[]^_`{|}", "\"~ !#$&'()*+,-./:;<=>?@[]^_`{|}\""},
	} {
		d := bucketDecision()
		d.Policy = tc.name
		pol := string(AppendPolicy(nil, &d, now))
		if !strings.HasPrefix(pol, tc.want+";q=") {
			t.Errorf("name %q: field %s, want the item %s", tc.name, pol, tc.want)
			continue
		}
		p := items(t, pol)
		if want := strings.NewReplacer(`\"`, `"`, `\\`, `\`).Replace(tc.want[1 : len(tc.want)-1]); len(p) != 1 || p[0].name != want {
			t.Errorf("name %q: parsed %q, want %q", tc.name, p[0].name, want)
		}
		for i := 0; i < len(pol); i++ {
			if pol[i] < 0x20 || pol[i] > 0x7e {
				t.Errorf("name %q: byte %#x in the field", tc.name, pol[i])
			}
		}
	}
}

// Every byte a name may hold, one at a time and all together: the field
// always parses and the name comes back by percent-decoding.
func TestEveryByteParses(t *testing.T) {
	var all []byte
	for c := 0; c < 256; c++ {
		all = append(all, byte(c))
		d := bucketDecision()
		d.Policy = "a" + string([]byte{byte(c)}) + "z"
		items(t, string(AppendPolicy(nil, &d, now)))
		items(t, string(AppendRateLimit(nil, &d, now)))
	}
	d := bucketDecision()
	d.Policy = string(all)
	p := items(t, string(AppendPolicy(nil, &d, now)))
	if got := percentDecode(t, p[0].name); got != string(all) {
		t.Fatalf("decoded name differs: %q", got)
	}
}

func percentDecode(t *testing.T, s string) string {
	t.Helper()
	var b []byte
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b = append(b, s[i])
			continue
		}
		var c byte
		for _, h := range []byte(s[i+1 : i+3]) {
			c <<= 4
			switch {
			case h >= '0' && h <= '9':
				c |= h - '0'
			case h >= 'A' && h <= 'F':
				c |= h - 'A' + 10
			default:
				t.Fatalf("bad escape in %q", s)
			}
		}
		b = append(b, c)
		i += 2
	}
	return string(b)
}

// RFC 9651 section 3.3.1: integers have at most 15 digits; out-of-range
// values are clamped, negative parameters (never meaningful in the draft)
// are 0.
func TestIntegerRange(t *testing.T) {
	for _, tc := range []struct {
		in   int64
		want string
	}{
		{0, "0"}, {999_999_999_999_999, "999999999999999"}, {1_000_000_000_000_000, "999999999999999"},
		{math.MaxInt64, "999999999999999"}, {-999_999_999_999_999, "-999999999999999"}, {math.MinInt64, "-999999999999999"},
	} {
		if got := string(appendInteger(nil, tc.in)); got != tc.want {
			t.Errorf("appendInteger(%d) = %s, want %s", tc.in, got, tc.want)
		}
	}
	d := bucketDecision()
	d.Bucket.Burst, d.Bucket.Remaining, d.Bucket.Rate = math.MaxInt64, -5, 1e-300
	d.Bucket.ResetAt = now.Add(-time.Hour)
	pol, rl := string(AppendPolicy(nil, &d, now)), string(AppendRateLimit(nil, &d, now))
	if pol != `"pro";q=999999999999999;w=999999999999999` || rl != `"pro";r=0;t=0` {
		t.Fatalf("policy %s, ratelimit %s", pol, rl)
	}
	items(t, pol)
	items(t, rl)
}

// RFC 9651 section 3.1.2: a key is [a-z*][a-z0-9_.*-]*.
func TestParameterKeys(t *testing.T) {
	re := regexp.MustCompile(`^[a-z*][a-z0-9_.*-]*$`)
	for _, k := range []string{keyQuota, keyWindow, keyRemaining, keyReset} {
		if !re.MatchString(k) {
			t.Errorf("key %q is not an sf-key", k)
		}
	}
}

// A decision that reached no bucket (an error's zero value) writes
// nothing: an empty List is not a valid field value.
func TestNothingToAdvertise(t *testing.T) {
	var d enforcement.Decision
	if HasPolicy(&d) || len(AppendPolicy(nil, &d, now)) != 0 || len(AppendRateLimit(nil, &d, now)) != 0 {
		t.Fatal("a zero decision advertised something")
	}
}

// No whitespace but the single SP after a member's comma (the RFC's
// serialisation): the canonical form, which a byte-for-byte comparison of
// two serialisers would expect.
func TestCanonicalForm(t *testing.T) {
	d := bucketDecision()
	d.Quota = enforcement.QuotaState{Limit: 10, Period: enforcement.PeriodHour, Known: true, Remaining: 9, ResetAt: now.Add(time.Hour)}
	for _, v := range []string{string(AppendPolicy(nil, &d, now)), string(AppendRateLimit(nil, &d, now))} {
		re, err := httpsfv.Marshal(parseList(t, v))
		if err != nil || re != v {
			t.Errorf("%q re-serialised by httpsfv is %q (%v)", v, re, err)
		}
	}
}

func TestParseMode(t *testing.T) {
	for _, s := range []string{"", "both", "legacy", "draft", "none"} {
		m, err := ParseMode(s)
		if err != nil || (s != "" && m.String() != s) {
			t.Errorf("ParseMode(%q) = %v, %v", s, m, err)
		}
	}
	if _, err := ParseMode("Both"); err == nil {
		t.Error("ParseMode accepted Both")
	}
	if !Both.LegacyFields() || !Both.DraftFields() || Legacy.DraftFields() || Draft.LegacyFields() || None.LegacyFields() || None.DraftFields() {
		t.Error("mode predicates")
	}
}

func TestAppendAllocatesNothing(t *testing.T) {
	d := bucketDecision()
	d.Quota = enforcement.QuotaState{Limit: 10, Period: enforcement.PeriodMonth, Known: true, Remaining: 9, ResetAt: now.Add(time.Hour)}
	buf := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() {
		b := AppendPolicy(buf[:0], &d, now)
		b = AppendRateLimit(b, &d, now)
		_ = AppendViolated(b, &d)
	}); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

func BenchmarkAppendFields(b *testing.B) {
	d := bucketDecision()
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		out := AppendPolicy(buf[:0], &d, now)
		out = AppendRateLimit(out, &d, now)
		buf = out[:0]
	}
}
