package global

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	byGlobal, byRegional    prometheus.Counter
	leased, returned        prometheus.Counter
	homeErrors, localErrors prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, g *Global) metrics {
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "limiter_region_decisions_total",
		Help: "Decisions on global limits by source: global (the region's pool of the global budget) or regional (the escrow, while the home is unreachable).",
	}, []string{"source"})
	m := metrics{
		byGlobal:   decisions.WithLabelValues("global"),
		byRegional: decisions.WithLabelValues("regional"),
		leased: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "limiter_region_leased_tokens_total",
			Help: "Tokens this instance leased from the global buckets at the home into the region's pools.",
		}),
		returned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "limiter_region_returned_tokens_total",
			Help: "Tokens this instance returned from the region's idle pools to the global buckets.",
		}),
		homeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "limiter_region_home_errors_total",
			Help: "Calls to the home region's Redis (leases, returns, probes) that failed.",
		}),
		localErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "limiter_region_pool_errors_total",
			Help: "Calls to the region's own Redis about the pools (decisions and refills) that failed.",
		}),
	}
	up := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "limiter_region_global_up",
		Help: "1 while the home region's Redis (the global budgets) answers this limiter, 0 while it is unreachable.",
	}, func() float64 {
		if g.unreachable.Load() {
			return 0
		}
		return 1
	})
	tokens := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "limiter_region_pool_tokens",
		Help: "Tokens held in the region's pools that this instance refills, as last read.",
	}, func() float64 { return float64(g.poolTokens.Load()) })
	rtt := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "limiter_region_home_rtt_seconds",
		Help: "Smoothed round trip of a call to the home region's Redis.",
	}, func() float64 { return float64(g.rttNS.Load()) / 1e9 })
	reg.MustRegister(decisions, m.leased, m.returned, m.homeErrors, m.localErrors, up, tokens, rtt)
	return m
}
