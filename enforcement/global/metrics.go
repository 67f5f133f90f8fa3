package global

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratewarden/ratewarden/internal/promdecl"
)

type metrics struct {
	byGlobal, byRegional    prometheus.Counter
	leased, returned        prometheus.Counter
	homeErrors, localErrors prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, g *Global) metrics {
	decisions := promdecl.CounterVec("limiter_region_decisions_total", "Decisions on global limits by source: global (the region's pool of the global budget) or regional (the escrow, while the home is unreachable).", "source")
	m := metrics{
		byGlobal:    decisions.WithLabelValues("global"),
		byRegional:  decisions.WithLabelValues("regional"),
		leased:      promdecl.Counter("limiter_region_leased_tokens_total", "Tokens this instance leased from the global buckets at the home into the region's pools."),
		returned:    promdecl.Counter("limiter_region_returned_tokens_total", "Tokens this instance returned from the region's idle pools to the global buckets."),
		homeErrors:  promdecl.Counter("limiter_region_home_errors_total", "Calls to the home region's Redis (leases, returns, probes) that failed."),
		localErrors: promdecl.Counter("limiter_region_pool_errors_total", "Calls to the region's own Redis about the pools (decisions and refills) that failed."),
	}
	up := promdecl.GaugeFunc("limiter_region_global_up", "1 while the home region's Redis (the global budgets) answers this limiter, 0 while it is unreachable.", func() float64 {
		if g.unreachable.Load() {
			return 0
		}
		return 1
	})
	tokens := promdecl.GaugeFunc("limiter_region_pool_tokens", "Tokens held in the region's pools that this instance refills, as last read.", func() float64 { return float64(g.poolTokens.Load()) })
	rtt := promdecl.GaugeFunc("limiter_region_home_rtt_seconds", "Smoothed round trip of a call to the home region's Redis.", func() float64 { return float64(g.rttNS.Load()) / 1e9 })
	reg.MustRegister(decisions, m.leased, m.returned, m.homeErrors, m.localErrors, up, tokens, rtt)
	return m
}
