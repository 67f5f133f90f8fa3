package notify

import (
	"errors"
	"net/http"
	"testing"
	"time"
)

// The test vector of the Standard Webhooks reference libraries.
func TestSignStandardWebhooksVector(t *testing.T) {
	key, err := ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		t.Fatal(err)
	}
	got := Sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", time.Unix(1614265330, 0), []byte(`{"test": 2432232314}`))
	if want := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Fatalf("signature %s, want %s", got, want)
	}
}

func TestVerify(t *testing.T) {
	key, _ := ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	other, _ := ParseSecret("whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
	now := time.Unix(1700000000, 0)
	body := []byte(`{"type":"x"}`)
	h := http.Header{}
	SetHeaders(h, key, "msg_1", now, body)
	if err := Verify(key, h, body, now.Add(time.Minute), 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	rotated := h.Clone()
	rotated.Set(HeaderSignature, Sign(other, "msg_1", now, body)+" "+h.Get(HeaderSignature))
	if err := Verify(key, rotated, body, now, 5*time.Minute); err != nil {
		t.Fatalf("second of two signatures: %v", err)
	}
	for name, tc := range map[string]struct {
		key  []byte
		h    http.Header
		body string
		at   time.Time
		want error
	}{
		"other body":   {key, h, `{"type":"y"}`, now, ErrBadSignature},
		"other secret": {other, h, string(body), now, ErrBadSignature},
		"too old":      {key, h, string(body), now.Add(6 * time.Minute), ErrBadTimestamp},
		"from future":  {key, h, string(body), now.Add(-6 * time.Minute), ErrBadTimestamp},
		"no headers":   {key, http.Header{}, string(body), now, ErrNoSignature},
	} {
		if err := Verify(tc.key, tc.h, []byte(tc.body), tc.at, 5*time.Minute); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	for _, s := range []string{"", "secret", "whsec_!!!", "whsec_c2hvcnQ="} {
		if _, err := ParseSecret(s); err == nil {
			t.Errorf("secret %q accepted", s)
		}
	}
}

func TestScheduleWait(t *testing.T) {
	s := DefaultSchedule()
	for _, tc := range []struct {
		n        int
		min, max time.Duration
	}{
		{1, time.Second, 2 * time.Second},
		{2, 2 * time.Second, 4 * time.Second},
		{3, 4 * time.Second, 8 * time.Second},
		{7, 64 * time.Second, 128 * time.Second},
		{9, 150 * time.Second, 300 * time.Second}, // capped at Max
		{40, 150 * time.Second, 300 * time.Second},
	} {
		if lo, hi := s.Wait(tc.n, 0), s.Wait(tc.n, 0.999999); lo != tc.min || hi > tc.max || hi < tc.max-time.Millisecond {
			t.Errorf("wait after attempt %d: [%s, %s], want [%s, %s]", tc.n, lo, hi, tc.min, tc.max)
		}
	}
	if (Schedule{}).orDefault() != DefaultSchedule() || (Schedule{Base: time.Second, Max: time.Millisecond, Attempts: 1}).validate() == nil {
		t.Fatal("defaults or validation wrong")
	}
}

func TestParseEndpoints(t *testing.T) {
	def := []byte("0123456789abcdef")
	m, err := parseEndpoints([]byte(`endpoints:
  acct_1: { url: "http://127.0.0.1:9/a" }
  acct_2: { url: "https://h.example/b", secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" }
`), def)
	if err != nil || len(m) != 2 || string(m["acct_1"].Key) != string(def) || m["acct_2"].URL != "https://h.example/b" {
		t.Fatalf("%v %v", m, err)
	}
	for _, bad := range []string{"endpoints: {a: {url: 'ftp://x'}}", "endpoints: {a: {url: 'http://x', secret: 'nope'}}", "endpoints: [1"} {
		if _, err := parseEndpoints([]byte(bad), def); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
	if _, err := parseEndpoints([]byte("endpoints: {a: {url: 'http://x'}}"), nil); err == nil {
		t.Error("an endpoint with no secret at all was accepted")
	}
}
