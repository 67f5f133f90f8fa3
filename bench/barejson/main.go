// Command barejson is the yardstick of the benchmarks, the HTTP floor: a
// net/http handler that decodes the /check request body and encodes a
// /check response with encoding/json and does no other work, so "what HTTP
// and the /check JSON alone cost on this machine" is measured in the same
// run as the limiter. -fixed answers a fixed byte string instead
// (no JSON work at all: the bare HTTP cost).
package main

import (
	"encoding/json"
	"flag"
	"io"
	"log"
	"net/http"
	"strconv"
	"time"
)

const fixedBody = `{"allowed":true,"remaining":999,"limit":1000,"resetAt":"2026-07-31T09:15:00Z","retryAfterMs":0,"source":"shared","policy":"bulk","tier":"bulk","cost":1,"dryRun":false,"wouldAllow":true,"warning":false}` + "\n"

type checkRequest struct {
	Key   string `json:"key"`
	Scope string `json:"scope"`
	Tier  string `json:"tier,omitempty"`
	Cost  *int64 `json:"cost,omitempty"`
}

type checkResponse struct {
	Allowed      bool   `json:"allowed"`
	Remaining    int64  `json:"remaining"`
	Limit        int64  `json:"limit"`
	ResetAt      string `json:"resetAt"`
	RetryAfterMs int64  `json:"retryAfterMs"`
	Source       string `json:"source"`
	Policy       string `json:"policy"`
	Tier         string `json:"tier"`
	Cost         int64  `json:"cost"`
	DryRun       bool   `json:"dryRun"`
	WouldAllow   bool   `json:"wouldAllow"`
	Warning      bool   `json:"warning"`
}

func main() {
	addr := flag.String("addr", "127.0.0.1:8090", "listen address")
	fixed := flag.Bool("fixed", false, "answer a fixed body without decoding the request (no JSON work)")
	flag.Parse()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if *fixed {
			_, _ = io.Copy(io.Discard, r.Body) // read the request body, as /check does
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", strconv.Itoa(len(fixedBody)))
			_, _ = w.Write([]byte(fixedBody))
			return
		}
		var req checkRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Key == "" || req.Scope == "" {
			http.Error(w, `{"error":{"code":"invalid_request"}}`, http.StatusBadRequest)
			return
		}
		cost := int64(1)
		if req.Cost != nil {
			cost = *req.Cost
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(checkResponse{Allowed: true, Remaining: 999, Limit: 1000,
			ResetAt: "2026-07-31T09:15:00Z", Source: "shared", Policy: "bulk", Tier: "bulk", Cost: cost, WouldAllow: true})
	})
	srv := &http.Server{Addr: *addr, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	log.Fatal(srv.ListenAndServe())
}
