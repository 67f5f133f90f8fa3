// Command grpcload drives the Envoy rate limit service
// (ShouldRateLimit) the way Envoy does: many concurrent streams over a
// few HTTP/2 connections, with requests marshaled once at start, so the
// load tool's own CPU stays small beside the server's on a shared
// machine (bench/h2grpc says why not grpc-go's client). It sends -n
// distinct descriptors [{key, <value><i>}] of -domain round robin, flat
// out (closed loop) or at -rate calls/s (open model), and reports calls/s,
// answers by overall code (ok, over_limit), errors by kind, latency
// percentiles and its own CPU per call.
//
//	grpcload -addr 127.0.0.1:8083 -n 10000 -conns 4 -streams 32 -duration 20s
//	grpcload -addr 127.0.0.1:8083 -n 1 -same -value flood_key -rate 2000 -duration 20s
//
// It exits 3 when any call failed (after printing the report), 1 when it
// could not run.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ratewarden/ratewarden/bench/h2grpc"
	"github.com/ratewarden/ratewarden/bench/rlsreq"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8083", "the limiter's gRPC address (plain text)")
	n := flag.Int("n", 10000, "distinct descriptors")
	domain := flag.String("domain", "bench", "the requests' domain")
	value := flag.String("value", "acct_", "the descriptor entry's value: a prefix followed by 1..n, or as is with -same")
	same := flag.Bool("same", false, "one descriptor (-value as is) for every call")
	conns := flag.Int("conns", 4, "HTTP/2 connections")
	streams := flag.Int("streams", 32, "calls in flight in total, spread over the connections")
	duration := flag.Duration("duration", 10*time.Second, "how long to start calls")
	calls := flag.Int64("calls", 0, "stop after this many calls (0: -duration only)")
	rate := flag.Float64("rate", 0, "calls per second in total (open model); 0 = flat out")
	timeout := flag.Duration("timeout", 0, "send grpc-timeout with every call, as Envoy does (its rate limit filter's default is 20ms); 0 = none")
	label := flag.String("label", "", "a label for the report")
	flag.Parse()
	if *same {
		*n = 1
	}
	bodies, err := rlsreq.Frames(rlsreq.Requests(*n, *domain, *value, *same))
	if err != nil {
		fmt.Fprintln(os.Stderr, "grpcload:", err)
		os.Exit(1)
	}
	var headers [][2]string
	if *timeout > 0 {
		headers = append(headers, h2grpc.Timeout(*timeout))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := h2grpc.Run(ctx, h2grpc.Config{
		Addr: *addr, Path: rlsreq.Method, Bodies: bodies, Headers: headers,
		Conns: *conns, Streams: *streams, Duration: *duration, Calls: *calls, Rate: *rate,
		Classify: rlsreq.Classify, Outcomes: rlsreq.Outcomes,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "grpcload:", err)
		os.Exit(1)
	}
	mode := "closed loop"
	if *rate > 0 {
		mode = fmt.Sprintf("%.0f calls/s offered", *rate)
	}
	fmt.Printf("grpcload %s: %s, %d descriptors, %d streams on %d connections, %s\n", *label, *addr, len(bodies), *streams, *conns, mode)
	fmt.Print(res.Text())
	if res.ErrorCount() > 0 {
		os.Exit(3)
	}
}
