// Command profile serves POST /check with the same stack as cmd/limiter
// (policy file, redisstore behind the guard, the two-tier Limiter, the
// httpapi handler) and writes a CPU profile of the process while a load tool
// drives it, so `go tool pprof -top` shows what limits throughput.
// Metering is off, as in the benchmarks.
package main

import (
	"context"
	"flag"
	"log"
	"net/http"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewarden/ratewarden/enforcement"
	"github.com/ratewarden/ratewarden/enforcement/httpapi"
	"github.com/ratewarden/ratewarden/enforcement/redisstore"
	"github.com/ratewarden/ratewarden/policy"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8095", "listen address")
	redisAddr := flag.String("redis", "127.0.0.1:6379", "Redis")
	policyFile := flag.String("policy", "bench/policy.yaml", "policy file")
	out := flag.String("cpuprofile", "cpu.pprof", "CPU profile output")
	pipelined := flag.Bool("pipeline", false, "use the auto-pipelined shared tier")
	timeout := flag.Duration("store-timeout", 100*time.Millisecond, "the guard's deadline per store call (cmd/limiter: LIMITER_STORE_TIMEOUT)")
	flag.Parse()

	pol, err := policy.Load(*policyFile)
	if err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: *redisAddr, PoolSize: 64, MinIdleConns: 8,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second, ContextTimeoutEnabled: true, MaxRetries: -1})
	defer rdb.Close()
	store := redisstore.New(rdb, "rl")
	if err := store.Preload(context.Background()); err != nil {
		log.Fatal(err)
	}
	var auth enforcement.Authority = store
	if *pipelined {
		p := redisstore.NewPipelined(rdb, "rl", redisstore.PipelineConfig{})
		pctx, stop := context.WithCancel(context.Background())
		ran := make(chan struct{})
		go func() { defer close(ran); _ = p.Run(pctx) }()
		defer func() { stop(); <-ran }()
		auth = p
	}
	lim, err := enforcement.New(enforcement.Config{Authority: redisstore.NewGuard(auth, redisstore.GuardSettings{Timeout: *timeout}, nil, nil), Policy: pol})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /check", httpapi.NewCheckHandler(lim, "", nil))
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}

	f, err := os.Create(*out)
	if err != nil {
		log.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		log.Fatal(err)
	}
	go func() { _ = srv.ListenAndServe() }()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	<-ctx.Done()
	pprof.StopCPUProfile()
	_ = f.Close()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
}
