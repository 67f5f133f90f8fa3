package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/hostile"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestHostileSlowClients: idle connections and slowloris senders (headers
// dribbled; a body dribbled to the admin API) are closed by the API's own
// timeouts (run.go: ReadHeaderTimeout 5 s, ReadTimeout 30 s; no variable
// shortens them, so the real ones are waited for) while /healthz and the
// dashboard page are served throughout. make stress-test runs it
// (hostile.Gate).
func TestHostileSlowClients(t *testing.T) {
	hostile.Gate(t)
	ch := testenv.StartClickHouse(t)
	api := start(t, "usage-api", "USAGE_API_ADDR", "/healthz", "CLICKHOUSE_ADDR="+ch.Addr(), "CLICKHOUSE_DATABASE="+ch.Database(t),
		"USAGE_ADMIN_TOKEN=hostile-admin-token-0123456789", "USAGE_TOKEN_SECRET=hostile-secret-0123456789abcdef")

	stop := make(chan struct{})
	lat := &hostile.Latencies{}
	var mu sync.Mutex
	var fails []string
	var wg sync.WaitGroup
	c := &http.Client{Timeout: 10 * time.Second}
	for _, path := range []string{"/healthz", "/"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 3000 { // bounded in count, and by stop in time
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				began := time.Now()
				resp, err := c.Get(api.url + path)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				lat.Add(time.Since(began))
				if err != nil || resp.StatusCode != 200 {
					mu.Lock()
					if len(fails) < 20 {
						fails = append(fails, fmt.Sprintf("GET %s: %v %v", path, err, resp))
					}
					mu.Unlock()
				}
			}
		}()
	}
	kinds, err := hostile.SlowClients(context.Background(), strings.TrimPrefix(api.url, "http://"),
		hostile.Slow{Idle: 300, SlowHeaders: 50, SlowBodies: 50, Path: "/v1/admin/portal-tokens", Bound: 90 * time.Second})
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kinds {
		t.Log(k)
		if k.Closed != k.Opened {
			t.Errorf("%s: the server closed %d of %d within 90 s", k.Name, k.Closed, k.Opened)
		}
	}
	t.Logf("normal traffic meanwhile: %s", lat)
	if len(fails) > 0 {
		t.Errorf("normal traffic beside the slow clients: %q", fails)
	}
	if lat.Len() == 0 {
		t.Error("no normal request was made")
	}
}
