package envconfig

import (
	"strings"
	"testing"
	"time"
)

func TestReaderGathersEveryProblemOnOneLine(t *testing.T) {
	env := map[string]string{"N": "7", "BAD_N": "x", "D": "2s", "BAD_D": "-1s", "L": " a, ,b ", "ADDR": "nohost", "F": "-2"}
	r := New(func(k string) string { return env[k] })
	if n := r.Int("N", 1, 0, 10); n != 7 {
		t.Errorf("Int = %d", n)
	}
	if n := r.Int("BAD_N", 3, 0, 10); n != 3 {
		t.Errorf("bad Int kept %d, want the default", n)
	}
	if d := r.Duration("D", 0, time.Second, time.Minute); d != 2*time.Second {
		t.Errorf("Duration = %v", d)
	}
	r.Duration("BAD_D", time.Second, time.Second, time.Minute)
	if l := r.List("L"); len(l) != 2 || l[0] != "a" || l[1] != "b" {
		t.Errorf("List = %q", l)
	}
	if s := r.String("UNSET", "def"); s != "def" {
		t.Errorf("String default = %q", s)
	}
	r.Float("F", 1)
	r.HostPort("ADDR", env["ADDR"])
	err := r.Err()
	if err == nil || strings.Contains(err.Error(), "\n") {
		t.Fatalf("Err = %v, want one line", err)
	}
	for _, name := range []string{"BAD_N:", "BAD_D:", "F:", "ADDR:"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("%v does not name %s", err, name)
		}
	}
	if New(func(string) string { return "" }).Err() != nil {
		t.Error("no problems must give a nil error")
	}
}
