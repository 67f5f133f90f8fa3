// Command barejson is the yardstick of the benchmarks: a bare net/http
// handler that answers every request with a fixed JSON body the size of a
// /check response, so "what HTTP alone costs on this machine" is measured
// in the same run as the limiter.
package main

import (
	"flag"
	"log"
	"net/http"
	"strconv"
	"time"
)

const body = `{"allowed":true,"remaining":999,"limit":1000,"resetAt":"2026-07-31T09:15:00Z","retryAfterMs":0,"source":"shared","policy":"bulk","tier":"bulk","cost":1,"dryRun":false,"wouldAllow":true,"warning":false}` + "\n"

func main() {
	addr := flag.String("addr", "127.0.0.1:8090", "listen address")
	flag.Parse()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 512)
		for { // read the request body, as /check does
			if _, err := r.Body.Read(buf); err != nil {
				break
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = w.Write([]byte(body))
	})
	srv := &http.Server{Addr: *addr, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	log.Fatal(srv.ListenAndServe())
}
