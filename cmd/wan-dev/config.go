package main

import (
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/testkit/wanproxy"
)

// conf is wan-dev's configuration.
type conf struct {
	links   []linkSpec
	control string
}

// linkSpec is one link and the address it listens on.
type linkSpec struct {
	listen string
	cfg    wanproxy.Config
}

func config(getenv func(string) string) (conf, error) {
	e := envconfig.New(getenv)
	c := conf{control: e.String("WAN_DEV_CONTROL_ADDR", "127.0.0.1:16400")}
	loopback(e, "WAN_DEV_CONTROL_ADDR", c.control)
	jitter := e.Float("WAN_DEV_JITTER", 0.1)
	if jitter < 0 || jitter >= 1 {
		e.Fail("WAN_DEV_JITTER", "%v: want a fraction in [0, 1)", jitter)
	}
	loss := e.Float("WAN_DEV_LOSS", 0)
	if loss < 0 || loss >= 1 {
		e.Fail("WAN_DEV_LOSS", "%v: want a probability in [0, 1)", loss)
	}
	reset := false
	switch m := e.String("WAN_DEV_CUT", "blackhole"); m {
	case "blackhole":
	case "reset":
		reset = true
	default:
		e.Fail("WAN_DEV_CUT", "%q: want blackhole or reset", m)
	}
	specs := e.List("WAN_DEV_LINKS")
	if len(specs) == 0 {
		e.Fail("WAN_DEV_LINKS", "required: FROM-TO=LISTEN>TARGET@DELAY, comma-separated")
	}
	seen := map[string]bool{}
	for _, s := range specs {
		l, err := parseLink(s)
		if err != nil {
			e.Fail("WAN_DEV_LINKS", "%v", err)
			continue
		}
		if seen[l.cfg.Name] {
			e.Fail("WAN_DEV_LINKS", "link %s given twice", l.cfg.Name)
		}
		seen[l.cfg.Name] = true
		loopback(e, "WAN_DEV_LINKS", l.listen)
		loopback(e, "WAN_DEV_LINKS", l.cfg.Target)
		l.cfg.Jitter, l.cfg.Loss, l.cfg.Reset = jitter, loss, reset
		c.links = append(c.links, l)
	}
	return c, e.Err()
}

// parseLink reads FROM-TO=LISTEN>TARGET@DELAY.
func parseLink(s string) (linkSpec, error) {
	name, rest, ok1 := strings.Cut(s, "=")
	listen, rest, ok2 := strings.Cut(rest, ">")
	target, delay, ok3 := strings.Cut(rest, "@")
	from, to, ok4 := strings.Cut(name, "-")
	if !ok1 || !ok2 || !ok3 || !ok4 || from == "" || to == "" {
		return linkSpec{}, fmt.Errorf("%q: want FROM-TO=LISTEN>TARGET@DELAY", s)
	}
	d, err := time.ParseDuration(delay)
	if err != nil || d < 0 || d > time.Minute {
		return linkSpec{}, fmt.Errorf("%q: delay %q: want a duration from 0 to 1m", s, delay)
	}
	return linkSpec{listen: listen, cfg: wanproxy.Config{Name: name, From: from, To: to, Target: target, Delay: d}}, nil
}

// loopback fails name unless addr is host:port on loopback: the test bed
// never listens on, or forwards to, another machine.
func loopback(e *envconfig.Reader, name, addr string) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		e.Fail(name, "%q: %v", addr, err)
		return
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		e.Fail(name, "%q: loopback addresses only", addr)
	}
}
