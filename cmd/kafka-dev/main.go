// Command kafka-dev runs an in-memory Kafka-protocol broker (kfake) on a
// fixed loopback port with the decisions topic created, for `make up` and
// local experiments. Nothing is persisted.
//
//	KAFKA_DEV_ADDR        listen address, default 127.0.0.1:9092 (loopback only)
//	KAFKA_TOPIC           topic to create, default ratelimit.decisions
//	KAFKA_DEV_PARTITIONS  partitions of the topic, default 4
package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/ratewarden/ratewarden/internal/kafkadev"
)

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	cfg, err := config(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kafka-dev:", err)
		os.Exit(2)
	}
	b, err := kafkadev.Start(cfg)
	if err != nil {
		log.Error("start broker", "err", err)
		os.Exit(1)
	}
	log.Info("kafka-dev broker listening", "addr", b.Addr(), "topic", cfg.Topic, "partitions", cfg.Partitions)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	b.Close()
	log.Info("kafka-dev broker stopped")
}

func config(getenv func(string) string) (kafkadev.Config, error) {
	addr := getenv("KAFKA_DEV_ADDR")
	if addr == "" {
		addr = "127.0.0.1:9092"
	}
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return kafkadev.Config{}, fmt.Errorf("KAFKA_DEV_ADDR=%q: %v", addr, err)
	}
	if host != "127.0.0.1" && host != "localhost" {
		return kafkadev.Config{}, fmt.Errorf("KAFKA_DEV_ADDR=%q: the dev broker listens on 127.0.0.1 only", addr)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port <= 0 || port > 65535 {
		return kafkadev.Config{}, fmt.Errorf("KAFKA_DEV_ADDR=%q: bad port", addr)
	}
	topic := getenv("KAFKA_TOPIC")
	if topic == "" {
		topic = "ratelimit.decisions"
	}
	parts := 4
	if s := getenv("KAFKA_DEV_PARTITIONS"); s != "" {
		parts, err = strconv.Atoi(s)
		if err != nil || parts < 1 || parts > 1024 {
			return kafkadev.Config{}, fmt.Errorf("KAFKA_DEV_PARTITIONS=%q: want an integer 1..1024", s)
		}
	}
	return kafkadev.Config{Port: port, Topic: topic, Partitions: parts}, nil
}
