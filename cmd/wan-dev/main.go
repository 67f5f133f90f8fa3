// Command wan-dev serves the WAN links of the multi-region test bed (make
// regions-up): one loopback listener per link, each forwarding to its
// target with the link's one-way delay, jitter and loss
// (testkit/wanproxy), and a loopback control endpoint that cuts and heals
// links by region.
//
//	WAN_DEV_LINKS         the links, comma-separated FROM-TO=LISTEN>TARGET@DELAY, e.g.
//	                      b-a=127.0.0.1:26391>127.0.0.1:16379@15ms (region b reaches
//	                      region a's Redis on 26391, 15 ms each way)
//	WAN_DEV_JITTER        each delay's spread, a fraction (default 0.1: ±10 %)
//	WAN_DEV_LOSS          the probability that a segment is lost (default 0)
//	WAN_DEV_CUT           blackhole (default: a cut stalls, as a partition does) or reset
//	                      (a cut closes connections and refuses new ones)
//	WAN_DEV_CONTROL_ADDR  the control endpoint (default 127.0.0.1:16400):
//	                      GET /links, POST /cut?region=b, POST /heal?region=b,
//	                      POST /cut?link=b-a, POST /heal?link=b-a
//
// Every address must be on loopback. It runs until SIGTERM or SIGINT.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/ratewarden/ratewarden/internal/lifecycle"
	"github.com/ratewarden/ratewarden/testkit/wanproxy"
)

func main() {
	os.Exit(program().Main(os.Args[1:], os.Stdout, os.Stderr))
}

// serve runs the links and the control endpoint until SIGTERM or SIGINT.
func serve() int {
	return lifecycle.Main("wan-dev", config, run)
}

// run binds every listener first (a port in use fails the start, before
// anything serves), then serves until ctx ends.
func run(ctx context.Context, cfg conf, log *slog.Logger) error {
	var links []*wanproxy.Link
	var lns []net.Listener
	closeAll := func() {
		for _, ln := range lns {
			ln.Close()
		}
	}
	for _, s := range cfg.links {
		l, err := wanproxy.New(s.cfg)
		if err != nil {
			closeAll()
			return err
		}
		ln, err := net.Listen("tcp", s.listen)
		if err != nil {
			closeAll()
			return fmt.Errorf("link %s: %w", s.cfg.Name, err)
		}
		links = append(links, l)
		lns = append(lns, ln)
	}
	ctl, err := net.Listen("tcp", cfg.control)
	if err != nil {
		closeAll()
		return fmt.Errorf("control endpoint: %w", err)
	}
	n := wanproxy.NewNet(links...)
	srv := &http.Server{Handler: n.Handler(), ReadHeaderTimeout: 5 * time.Second}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, len(links)+1)
	for i, l := range links {
		wg.Go(func() {
			if err := l.Serve(ctx, lns[i]); err != nil {
				errs <- err
				cancel()
			}
		})
		log.Info("link", "name", l.Name(), "listen", lns[i].Addr().String(), "target", cfg.links[i].cfg.Target,
			"delay", cfg.links[i].cfg.Delay.String(), "jitter", cfg.links[i].cfg.Jitter, "loss", cfg.links[i].cfg.Loss)
	}
	wg.Go(func() {
		if err := srv.Serve(ctl); !errors.Is(err, http.ErrServerClosed) {
			errs <- fmt.Errorf("control endpoint: %w", err)
			cancel()
		}
	})
	log.Info("wan-dev serving", "links", len(links), "control", ctl.Addr().String())
	<-ctx.Done()
	sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
	srv.Shutdown(sctx)
	scancel()
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	log.Info("wan-dev stopped")
	return nil
}
