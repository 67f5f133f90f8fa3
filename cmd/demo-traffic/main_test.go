package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

func TestLoadConfig(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	c, err := loadConfig(env(nil))
	if err != nil || c.base != "http://127.0.0.1:8080" || c.rps != 40 {
		t.Fatalf("defaults: %+v, %v", c, err)
	}
	c, err = loadConfig(env(map[string]string{"DEMO_LIMITER_URL": "http://10.0.0.1:9/", "DEMO_RPS": "5", "LIMITER_AUTH_TOKEN": "t"}))
	if err != nil || c.base != "http://10.0.0.1:9" || c.rps != 5 || c.token != "t" {
		t.Fatalf("set: %+v, %v", c, err)
	}
	for _, bad := range []map[string]string{{"DEMO_RPS": "0"}, {"DEMO_RPS": "x"}, {"DEMO_RPS": "2001"}, {"DEMO_LIMITER_URL": "ftp://x"}, {"DEMO_LIMITER_URL": "nohost"}} {
		if _, err := loadConfig(env(bad)); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// TestRunSendsTheMix: every request is a valid /check body with the token,
// and every entry of the mix is sent.
func TestRunSendsTheMix(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/check" || r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "bad request line", http.StatusBadRequest)
			return
		}
		var c call
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil || c.Key == "" || c.Scope == "" {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		mu.Lock()
		seen[c.Key+" "+c.Scope]++
		mu.Unlock()
		_, _ = io.WriteString(w, `{"allowed":true}`)
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(ctx, config{base: srv.URL, rps: 2000, token: "tok"}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	deadline := time.Now().Add(testenv.Timeout(10 * time.Second))
	for {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n == len(uniqueCalls()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("saw %d distinct calls, want %d: %v", n, len(uniqueCalls()), seen)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
}

func uniqueCalls() map[string]bool {
	u := map[string]bool{}
	for _, c := range mix {
		u[c.Key+" "+c.Scope] = true
	}
	return u
}

func TestCheckReportsErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":{"code":"unauthorized"}}`, http.StatusUnauthorized)
	}))
	defer srv.Close()
	_, _, err := check(context.Background(), &http.Client{Timeout: time.Second}, config{base: srv.URL}, mix[0])
	if err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("err = %v, want the status", err)
	}
}

func TestUsedTokensDifferFromTheEstimate(t *testing.T) {
	below, above := 0, 0
	for i := range 1000 {
		u := usedTokens(i, 300)
		if u < 30 || u > 600 {
			t.Fatalf("call %d used %d of an estimate of 300", i, u)
		}
		if u < 300 {
			below++
		} else if u > 300 {
			above++
		}
	}
	if below == 0 || above == 0 {
		t.Fatalf("used below the estimate %d times, above %d: settles must both refund and charge more", below, above)
	}
}
