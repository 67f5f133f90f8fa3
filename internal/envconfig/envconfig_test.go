package envconfig

import (
	"os"
	"path/filepath"
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

func TestSecretFromVariableOrFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "pw")
	if err := os.WriteFile(file, []byte("s3cr3t\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"A_PASSWORD": "pw-A-7f3e", "B_PASSWORD_FILE": file,
		"C_PASSWORD": "pw-C-9a1b", "C_PASSWORD_FILE": file, "D_PASSWORD_FILE": filepath.Join(dir, "missing")}
	r := New(func(k string) string { return env[k] })
	if got := r.Secret("A_PASSWORD"); got != "pw-A-7f3e" {
		t.Errorf("A_PASSWORD = %q, want pw-A-7f3e", got)
	}
	if got := r.Secret("B_PASSWORD"); got != "s3cr3t" {
		t.Errorf("B_PASSWORD from file = %q, want s3cr3t (trailing newline dropped)", got)
	}
	if got := r.Secret("E_PASSWORD"); got != "" {
		t.Errorf("unset E_PASSWORD = %q, want empty", got)
	}
	r.Secret("C_PASSWORD")
	r.Secret("D_PASSWORD")
	err := r.Err()
	if err == nil || !strings.Contains(err.Error(), "C_PASSWORD and C_PASSWORD_FILE are both set") ||
		!strings.Contains(err.Error(), "D_PASSWORD_FILE") {
		t.Fatalf("Err() = %v, want both-set and missing-file problems", err)
	}
	if strings.Contains(err.Error(), "s3cr3t") || strings.Contains(err.Error(), "pw-A-7f3e") {
		t.Fatalf("an error carries a secret: %v", err)
	}
}

func TestBytes(t *testing.T) {
	env := map[string]string{"A": "1GiB", "B": "512 MiB", "C": "4096", "D": "2KB", "E": "1.5GiB", "F": "-1", "G": "9TiB", "H": "10B"}
	r := New(func(k string) string { return env[k] })
	for name, want := range map[string]int64{"A": 1 << 30, "B": 512 << 20, "C": 4096, "D": 2000, "H": 10, "Z": 7} {
		if got := r.Bytes(name, 7, 0, 1<<40); got != want {
			t.Errorf("%s=%q: %d, want %d", name, env[name], got, want)
		}
	}
	if r.Err() != nil {
		t.Fatalf("valid sizes refused: %v", r.Err())
	}
	for _, name := range []string{"E", "F", "G"} {
		r := New(func(k string) string { return env[k] })
		r.Bytes(name, 0, 0, 1<<40)
		if r.Err() == nil || !strings.Contains(r.Err().Error(), name) {
			t.Errorf("%s=%q accepted: %v", name, env[name], r.Err())
		}
	}
}
