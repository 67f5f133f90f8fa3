// Command demo-traffic sends a small, steady mix of POST /check requests to
// a limiter so that the local stack (`make up`) has something to show: a few
// customer keys of every tier, several scopes, one key that runs over its
// limit and one anonymous address. It is a demo, not a load generator.
//
//	DEMO_LIMITER_URL    limiter base URL, default http://127.0.0.1:8080
//	DEMO_RPS            requests per second in total, default 40 (1..2000)
//	LIMITER_AUTH_TOKEN  bearer token, when the limiter requires one
//
// It stops on SIGTERM or SIGINT and logs a summary every 10 seconds.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// call is one request of the mix.
type call struct {
	Key   string `json:"key"`
	Scope string `json:"scope"`
	Cost  *int   `json:"cost,omitempty"`
}

// mix is one cycle of requests; the cycle repeats. Its shape: the pro
// account searches (dry-run rule), the enterprise account is busy, the free
// user runs over its 10/s limit part of the time, exports hit the
// per-minute rule, and an anonymous address is rejected most of the time.
var mix = []call{
	{Key: "acct_demo_pro", Scope: "api:search"},
	{Key: "acct_demo_pro", Scope: "api:orders"},
	{Key: "acct_8812", Scope: "api:orders"},
	{Key: "acct_8812", Scope: "api:search"},
	{Key: "acct_8812", Scope: "api:orders"},
	{Key: "user:alice", Scope: "api:orders"},
	{Key: "user:alice", Scope: "api:orders"},
	{Key: "user:alice", Scope: "api:search"},
	{Key: "acct_demo_pro", Scope: "api:export"},
	{Key: "ip:203.0.113.7", Scope: "api:orders"},
	{Key: "acct_8812", Scope: "health"},
	{Key: "user:bob", Scope: "api:orders"},
}

type config struct {
	base  string
	rps   int
	token string
}

func loadConfig(getenv func(string) string) (config, error) {
	c := config{base: "http://127.0.0.1:8080", rps: 40, token: getenv("LIMITER_AUTH_TOKEN")}
	if v := strings.TrimSpace(getenv("DEMO_LIMITER_URL")); v != "" {
		c.base = strings.TrimRight(v, "/")
	}
	if u, err := url.Parse(c.base); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return c, fmt.Errorf("DEMO_LIMITER_URL %q is not an http(s) URL", c.base)
	}
	if v := strings.TrimSpace(getenv("DEMO_RPS")); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 2000 {
			return c, fmt.Errorf("DEMO_RPS %q is not an integer in [1, 2000]", v)
		}
		c.rps = n
	}
	return c, nil
}

func main() {
	os.Exit(program().Main(os.Args[1:], os.Stdout, os.Stderr))
}

// serve sends the mix until SIGTERM or SIGINT and returns the exit code.
func serve() int {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	cfg, err := loadConfig(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo-traffic: invalid configuration:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	run(ctx, cfg, log)
	return 0
}

// run sends the mix at cfg.rps until ctx ends. Requests are sequential: one
// in flight at a time, each with a 2 s deadline.
func run(ctx context.Context, cfg config, log *slog.Logger) {
	client := &http.Client{Timeout: 2 * time.Second}
	tick := time.NewTicker(time.Second / time.Duration(cfg.rps))
	defer tick.Stop()
	report := time.NewTicker(10 * time.Second)
	defer report.Stop()
	log.Info("demo traffic started", "limiter", cfg.base, "rps", cfg.rps)
	var sent, allowed, rejected, failed int
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			log.Info("demo traffic stopped", "sent", sent, "allowed", allowed, "rejected", rejected, "failed", failed)
			return
		case <-report.C:
			log.Info("demo traffic", "sent", sent, "allowed", allowed, "rejected", rejected, "failed", failed)
			continue
		case <-tick.C:
		}
		ok, err := check(ctx, client, cfg, mix[i%len(mix)])
		sent++
		switch {
		case err != nil:
			failed++
			if failed%50 == 1 {
				log.Warn("check failed", "err", err)
			}
		case ok:
			allowed++
		default:
			rejected++
		}
	}
}

func check(ctx context.Context, client *http.Client, cfg config, c call) (bool, error) {
	body, err := json.Marshal(c)
	if err != nil {
		return false, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.base+"/check", bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	if cfg.token != "" {
		req.Header.Set("Authorization", "Bearer "+cfg.token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, fmt.Errorf("POST /check: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return false, fmt.Errorf("POST /check: read body: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("POST /check: status %d: %s", resp.StatusCode, bytes.TrimSpace(raw))
	}
	var d struct {
		Allowed bool `json:"allowed"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return false, fmt.Errorf("POST /check: decode: %w", err)
	}
	return d.Allowed, nil
}
