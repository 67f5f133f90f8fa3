package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/metadata"

	"github.com/ratewarden/ratewarden/enforcement/envoyrls/envoyrlstest"
	"github.com/ratewarden/ratewarden/testkit/otlptest"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// otelEnv points a binary at an OTLP receiver, exporting every 100 ms
// (the default batch delay is 5 s).
func otelEnv(rcv *otlptest.Receiver) []string {
	return []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rcv.Endpoint(), "OTEL_BSP_SCHEDULE_DELAY=100"}
}

// spansOf returns the spans of one trace by name (the last of each name).
func spansOf(spans []otlptest.Span, traceID string) map[string]otlptest.Span {
	out := map[string]otlptest.Span{}
	for _, s := range spans {
		if s.TraceID == traceID {
			out[s.Name] = s
		}
	}
	return out
}

// noKeyIn fails the test if any attribute of spans holds a rate-limit key:
// keys are secrets or personal data, never exported.
func noKeyIn(t *testing.T, spans []otlptest.Span, keys ...string) {
	t.Helper()
	for _, s := range spans {
		for k, v := range s.Attributes {
			for _, key := range keys {
				if strings.Contains(v, key) {
					t.Errorf("span %q attribute %s=%q carries the key %q", s.Name, k, v, key)
				}
			}
		}
	}
}

// TestCheckTraceFromLimiterToDecisionsRaw is deliverable 2 of the issue
// end to end, with real components only: a /check carrying a W3C
// traceparent produces, at a real OTLP/HTTP receiver, the limiter's spans
// of that trace (the request, the decision, its Redis call with the batch
// it rode in); the decision's row in decisions_raw, written by the real
// meter-consumer from the real Kafka-protocol broker, holds the trace id
// (and an unsampled decision's row holds NULL); the latency histogram
// carries the trace as an exemplar; and the meter-consumer's batch spans
// reach the receiver too.
func TestCheckTraceFromLimiterToDecisionsRaw(t *testing.T) {
	t.Parallel()
	rcv := otlptest.StartHTTP(t)
	r := testenv.StartRedis(t)
	k := testenv.StartKafka(t, "ratelimit.decisions", 2)
	ch := testenv.StartClickHouse(t)
	db := ch.Database(t)

	consumerBin := testenv.Binary(t, "cmd/meter-consumer")
	consumer := exec.Command(consumerBin)
	consumer.Env = append(os.Environ(), "KAFKA_BROKERS="+k.Addr(), "CLICKHOUSE_ADDR="+ch.Addr(),
		"CLICKHOUSE_DATABASE="+db, fmt.Sprintf("METER_ADDR=127.0.0.1:%d", testenv.FreePort(t)))
	consumer.Env = append(consumer.Env, otelEnv(rcv)...)
	logs := &syncBuffer{}
	consumer.Stderr = logs
	consumer.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := consumer.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		consumer.Process.Signal(syscall.SIGTERM)
		consumer.Wait()
		if t.Failed() {
			t.Logf("meter-consumer logs:\n%s", logs.String())
		}
	})

	p := startLimiter(t, meteringPolicy, append([]string{"REDIS_ADDRS=" + r.Addr(), "KAFKA_BROKERS=" + k.Addr(), "LIMITER_GRPC_ADDR="}, otelEnv(rcv)...)...)
	const (
		traceID  = "4bf92f3577b34da6a3ce929d0e0e4736"
		parentID = "00f067aa0ba902b7"
	)
	post := func(key, traceparent string) {
		req, _ := http.NewRequest(http.MethodPost, p.url+"/check", strings.NewReader(`{"key":"`+key+`","scope":"api:read"}`))
		req.Header.Set("traceparent", traceparent)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("/check %s: %d", key, resp.StatusCode)
		}
	}
	post("acct_traced", "00-"+traceID+"-"+parentID+"-01")
	// Flags 00: the caller did not sample, so neither does the limiter
	// (parentbased_always_on, the default): no spans, no trace id.
	post("acct_untraced", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00")

	spans := rcv.Wait(t, "the limiter's spans of the /check trace", 60*time.Second, func(s []otlptest.Span) bool {
		return len(spansOf(s, traceID)) >= 3
	})
	got := spansOf(spans, traceID)
	server, decide, store := got["POST /check"], got["ratewarden.decide"], got["ratewarden.store.take"]
	if server.ParentSpanID != parentID || server.Service != "limiter" {
		t.Errorf("POST /check span %+v: want the caller's span %s as parent, service limiter", server, parentID)
	}
	if decide.ParentSpanID != server.SpanID || store.ParentSpanID != decide.SpanID {
		t.Errorf("want POST /check → ratewarden.decide → ratewarden.store.take, got parents %s→%s, %s→%s (server %s)",
			decide.SpanID, decide.ParentSpanID, store.SpanID, store.ParentSpanID, server.SpanID)
	}
	for k, want := range map[string]string{"ratewarden.scope": "api:read", "ratewarden.tier": "free", "ratewarden.allowed": "true",
		"ratewarden.cost": "1", "ratewarden.source": "shared"} {
		if decide.Attributes[k] != want {
			t.Errorf("decide span %s = %q, want %q (%v)", k, decide.Attributes[k], want, decide.Attributes)
		}
	}
	if n, _ := strconv.Atoi(store.Attributes["ratewarden.store.batch_size"]); n < 1 || store.Attributes["ratewarden.store"] != "redis" ||
		store.Attributes["db.system.name"] != "redis" {
		t.Errorf("store span attributes %v: want store redis and a batch size ≥ 1", store.Attributes)
	}
	noKeyIn(t, spans, "acct_traced", "acct_untraced")
	for _, s := range spans {
		if s.TraceID == "0af7651916cd43dd8448eb211c80319c" {
			t.Errorf("a span of the unsampled trace was exported: %+v", s)
		}
	}

	// The exemplar: OpenMetrics exposition of the latency histogram.
	req, _ := http.NewRequest(http.MethodGet, p.url+"/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	exemplar := false
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "limiter_decision_duration_seconds_bucket") && strings.Contains(line, `# {trace_id="`+traceID+`"}`) {
			exemplar = true
		}
	}
	if !exemplar {
		t.Errorf("no limiter_decision_duration_seconds bucket has the exemplar trace_id=%s", traceID)
	}

	// The usage row, from the trace id; the unsampled decision's has NULL.
	conn := ch.Conn(t)
	deadline := time.Now().Add(testenv.Timeout(90 * time.Second))
	for {
		var key string
		var nulls uint64
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := conn.QueryRow(ctx, "SELECT any(key) FROM "+db+".decisions_raw WHERE trace_id = ?", traceID).Scan(&key)
		if err == nil {
			err = conn.QueryRow(ctx, "SELECT count() FROM "+db+".decisions_raw WHERE key = 'acct_untraced' AND isNull(trace_id)").Scan(&nulls)
		}
		cancel()
		if err == nil && key == "acct_traced" && nulls == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("decisions_raw: the traced row's key %q, untraced rows with NULL trace_id %d (err %v); want acct_traced and 1", key, nulls, err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// The meter-consumer's batch span with its INSERTs, and the traced
	// event counted in it.
	rcv.Wait(t, "the meter-consumer's batch span", 60*time.Second, func(s []otlptest.Span) bool {
		var batch string
		for _, x := range s {
			if x.Service == "meter-consumer" && x.Name == "meter.write_batch" && x.Attributes["ratewarden.batch.traced_events"] == "1" {
				batch = x.SpanID
			}
		}
		for _, x := range s {
			if batch != "" && x.ParentSpanID == batch && x.Name == "clickhouse INSERT" && strings.Contains(x.Attributes["db.query.text"], "decisions_raw") {
				return true
			}
		}
		return false
	})
}

// TestShouldRateLimitContinuesTheTraceInMetadata: a ShouldRateLimit call
// whose gRPC metadata carries a traceparent gets a server span in that
// trace, with a decision span per descriptor under it.
func TestShouldRateLimitContinuesTheTraceInMetadata(t *testing.T) {
	rcv := otlptest.StartHTTP(t)
	r := testenv.StartRedis(t)
	_, addr := startEnvoyLimiter(t, envoyrlstest.EdgePolicy, append([]string{"REDIS_ADDRS=" + r.Addr()}, otelEnv(rcv)...)...)
	c := rlsv3.NewRateLimitServiceClient(dial(t, addr))
	const traceID = "5bf92f3577b34da6a3ce929d0e0e4737"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", "00-"+traceID+"-10f067aa0ba902b8-01")
	resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		desc("remote_address", "10.0.0.1"), desc("api_key", "k_pro", "path", "/orders")}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("ShouldRateLimit: %v %v", resp, err)
	}
	spans := rcv.Wait(t, "the gRPC call's spans", 60*time.Second, func(s []otlptest.Span) bool {
		n := 0
		for _, x := range s {
			if x.TraceID == traceID && x.Name == "ratewarden.decide" {
				n++
			}
		}
		return n == 2 && len(spansOf(s, traceID)) >= 3
	})
	got := spansOf(spans, traceID)
	server := got["envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"]
	if server.ParentSpanID != "10f067aa0ba902b8" {
		t.Fatalf("server span %+v: want the metadata's span as parent; spans %v", server, got)
	}
	scopes := map[string]bool{}
	for _, s := range spans {
		if s.TraceID == traceID && s.Name == "ratewarden.decide" {
			if s.ParentSpanID != server.SpanID || s.Attributes["ratewarden.domain"] != "edge" {
				t.Errorf("decide span %+v: want a child of the server span, domain edge", s)
			}
			scopes[s.Attributes["ratewarden.scope"]] = true
		}
	}
	if !scopes["edge"] || !scopes["route:/orders"] {
		t.Errorf("decision scopes %v, want edge and route:/orders", scopes)
	}
	noKeyIn(t, spans, "10.0.0.1", "k_pro")
}
