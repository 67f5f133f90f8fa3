// Command demo-traffic sends a small, steady mix of POST /check requests to
// a limiter so that the local stack (`make up`) has something to show: a few
// customer keys of every tier, several scopes, one key that runs over its
// limit and one anonymous address, and LLM-shaped calls on the scope
// llm:tokens: a reservation of a few hundred tokens (the request's
// max_tokens), settled with the tokens the completion "used", which
// differ from it. It is a demo, not a load generator.
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
	Key     string `json:"key"`
	Scope   string `json:"scope"`
	Cost    *int   `json:"cost,omitempty"`
	Reserve bool   `json:"reserve,omitempty"` // Cost is an estimate, settled after
}

// usedTokens is what the i-th LLM-shaped call "used": from a tenth of
// its estimate to twice it, so settles both refund and charge beyond.
func usedTokens(i, estimate int) int {
	return estimate/10 + (i*7919)%(2*estimate-estimate/10+1)
}

func intp(n int) *int { return &n }

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
	{Key: "acct_demo_pro", Scope: "llm:tokens", Cost: intp(300), Reserve: true},
	{Key: "acct_8812", Scope: "llm:tokens", Cost: intp(500), Reserve: true},
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
		c := mix[i%len(mix)]
		ok, id, err := check(ctx, client, cfg, c)
		if err == nil && id != "" {
			err = settle(ctx, client, cfg, id, usedTokens(i, *c.Cost))
		}
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

// check posts one call; reservation is the id of an allowed reserving one.
func check(ctx context.Context, client *http.Client, cfg config, c call) (allowed bool, reservation string, err error) {
	body, err := json.Marshal(c)
	if err != nil {
		return false, "", err
	}
	raw, err := post(ctx, client, cfg, "/check", body)
	if err != nil {
		return false, "", err
	}
	var d struct {
		Allowed     bool   `json:"allowed"`
		Reservation string `json:"reservation"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return false, "", fmt.Errorf("POST /check: decode: %w", err)
	}
	return d.Allowed, d.Reservation, nil
}

// settle posts the actual cost of a reservation.
func settle(ctx context.Context, client *http.Client, cfg config, id string, cost int) error {
	body, err := json.Marshal(map[string]any{"reservation": id, "cost": cost})
	if err != nil {
		return err
	}
	_, err = post(ctx, client, cfg, "/settle", body)
	return err
}

// post sends body to path and returns the answer of a 200 (or 202).
func post(ctx context.Context, client *http.Client, cfg config, path string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if cfg.token != "" {
		req.Header.Set("Authorization", "Bearer "+cfg.token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("POST %s: %w", path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("POST %s: read body: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusAccepted {
		return nil, fmt.Errorf("POST %s: status %d: %s", path, resp.StatusCode, bytes.TrimSpace(raw))
	}
	return raw, nil
}
