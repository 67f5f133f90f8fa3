package consumer

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/internal/envconfig"
	"github.com/ratewarden/ratewarden/internal/kafkaconn"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// The watchdog asks the broker for high watermarks on a connection of its
// own: against a broker that takes only TLS and SASL it must reach it the
// way the rest of the consumer does, or it never sees lag and a stalled
// partition goes unnoticed. Here a running partition with messages to read
// and no progress is counted as stalled and restarted.
func TestWatchdogSeesLagOnASecureBroker(t *testing.T) {
	k := testenv.StartSecureKafka(t, "decisions", 1)
	env := map[string]string{}
	for _, kv := range k.Env("scram-sha-512", k.PasswordFile) {
		name, value, _ := strings.Cut(kv, "=")
		env[name] = value
	}
	getenv := func(name string) string { return env[name] }
	e := envconfig.New(getenv)
	sec := kafkaconn.FromEnv(e, getenv)
	if err := e.Err(); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w := &kafka.Writer{Addr: kafka.TCP(k.Addr()), Topic: k.Topic(), Transport: sec.Transport("test", 5*time.Second),
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	msgs := make([]kafka.Message, 20)
	for i := range msgs {
		msgs[i] = kafka.Message{Value: []byte("x")}
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()

	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	restarted := make(chan struct{})
	var once sync.Once // a stall lasting on is counted (and restarted) again
	st := &partState{}
	st.start(0, func() { once.Do(func() { close(restarted) }) })
	c := &Consumer{
		cfg:   Config{Brokers: []string{k.Addr()}, Topic: k.Topic(), StallAfter: 400 * time.Millisecond, TLS: sec.TLS, SASL: sec.SASL},
		log:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		m:     m,
		parts: map[int]*partState{0: st},
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.watch(wctx)
	}()
	defer func() { stop(); <-done }()
	select {
	case <-restarted:
	case <-ctx.Done():
		t.Fatal("no stall seen within 30 s: the watchdog did not learn the partition's high watermark")
	}
	if why := st.stallReason(); why == "" {
		t.Fatal("restarted without a stall reason")
	}
}
