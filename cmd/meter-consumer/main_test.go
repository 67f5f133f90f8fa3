package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// TestMain doubles as the meter-consumer binary for the configuration
// tests, which need no build: they start the test executable itself with
// METER_CONSUMER_AS_BINARY=1. The tests that run the consumer as a service
// start the built binary (testenv.Binary).
func TestMain(m *testing.M) {
	if os.Getenv("METER_CONSUMER_AS_BINARY") == "1" {
		os.Exit(serve()) // not main: the test binary's own flags are not the consumer's words
	}
	os.Exit(testenv.Main(m))
}

func binaryCmd(env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append([]string{"METER_CONSUMER_AS_BINARY=1", "PATH=" + os.Getenv("PATH"), "GORACE=" + os.Getenv("GORACE")}, env...)
	return cmd
}

func TestInvalidConfigExitsWithOneLineNamingTheVariable(t *testing.T) {
	cases := []struct {
		env  []string
		name string
	}{
		{nil, "KAFKA_BROKERS"},
		{[]string{"KAFKA_BROKERS=nohost"}, "KAFKA_BROKERS"},
		{[]string{"KAFKA_BROKERS=127.0.0.1:9092", "CLICKHOUSE_DATABASE=bad-name"}, "CLICKHOUSE_DATABASE"},
		{[]string{"KAFKA_BROKERS=127.0.0.1:9092", "WEBHOOK_URL=https://example.test/hook"}, "WEBHOOK_SECRET"},
		{[]string{"KAFKA_BROKERS=127.0.0.1:9092", "WEBHOOK_URL=https://example.test/hook", "WEBHOOK_SECRET=plain"}, "WEBHOOK_SECRET"},
		// A key shorter than the notifier accepts (16 bytes): refused here,
		// by the notifier's rule, not when the notifier starts.
		{[]string{"KAFKA_BROKERS=127.0.0.1:9092", "WEBHOOK_URL=https://example.test/hook", "WEBHOOK_SECRET=whsec_c2hvcnQ="}, "WEBHOOK_SECRET"},
		{[]string{"KAFKA_BROKERS=127.0.0.1:9092", "WEBHOOK_URL=https://example.test/hook", "WEBHOOK_SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "WEBHOOK_COOLDOWN=soon"}, "WEBHOOK_COOLDOWN"},
		{[]string{"KAFKA_BROKERS=127.0.0.1:9092", "POLICY_JUDGE_SETTLE=2h"}, "POLICY_JUDGE_SETTLE"},
		// 0 would reach the judge as "unset", the default 30 s.
		{[]string{"KAFKA_BROKERS=127.0.0.1:9092", "POLICY_JUDGE_SETTLE=0"}, "POLICY_JUDGE_SETTLE"},
		{[]string{"KAFKA_BROKERS=127.0.0.1:9092", "METER_ADDR=8082"}, "METER_ADDR"},
		{[]string{"KAFKA_BROKERS=127.0.0.1:9092", "METER_BATCH_SIZE=0"}, "METER_BATCH_SIZE"},
		{[]string{"KAFKA_BROKERS=127.0.0.1:9092", "METER_STALL_AFTER=0s"}, "METER_STALL_AFTER"},
		{[]string{"KAFKA_BROKERS=127.0.0.1:9092", "METER_STALL_AFTER=soon"}, "METER_STALL_AFTER"},
		{[]string{"KAFKA_BROKERS=127.0.0.1:9092", "REDIS_ADDRS=nohost"}, "REDIS_ADDRS"},
		{[]string{"KAFKA_BROKERS=127.0.0.1:9092", "METER_RECONCILE_EVERY=0s"}, "METER_RECONCILE_EVERY"},
		{[]string{"KAFKA_BROKERS=127.0.0.1:9092", "CLICKHOUSE_CLUSTER=ratewarden"}, "CLICKHOUSE_SHARDS"},
		{[]string{"KAFKA_BROKERS=127.0.0.1:9092", "CLICKHOUSE_CLUSTER=ratewarden", "CLICKHOUSE_SHARDS=a:1;;b:2"}, "CLICKHOUSE_SHARDS"},
		// internal/tracing's variables, found with the others (they used
		// to exit 1 once ClickHouse was opened).
		{[]string{"KAFKA_BROKERS=127.0.0.1:9092", "OTEL_TRACES_SAMPLER=sometimes"}, "OTEL_TRACES_SAMPLER"},
		{[]string{"KAFKA_BROKERS=127.0.0.1:9092", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION=zip"}, "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"},
		// The reconciler's policy file, read before anything runs.
		{[]string{"KAFKA_BROKERS=127.0.0.1:9092", "REDIS_ADDRS=127.0.0.1:1", "POLICY_FILE=/nonexistent/policy.yaml"}, "POLICY_FILE"},
		// Several wrong at once: all on the one line.
		{[]string{"METER_BATCH_SIZE=0", "OTEL_TRACES_SAMPLER=traceidratio", "OTEL_TRACES_SAMPLER_ARG=2"}, "KAFKA_BROKERS"},
		{[]string{"METER_BATCH_SIZE=0", "OTEL_TRACES_SAMPLER=traceidratio", "OTEL_TRACES_SAMPLER_ARG=2"}, "METER_BATCH_SIZE"},
		{[]string{"METER_BATCH_SIZE=0", "OTEL_TRACES_SAMPLER=traceidratio", "OTEL_TRACES_SAMPLER_ARG=2"}, "OTEL_TRACES_SAMPLER_ARG"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// A value it wrongly accepts starts the service: stopped after
			// a minute, it fails the case instead of the whole run hanging.
			cmd := binaryCmd(c.env...)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			stop := time.AfterFunc(time.Minute, func() { cmd.Process.Kill() })
			err := cmd.Wait()
			stop.Stop()
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
				t.Fatalf("exit %v, want 2 (a configuration error); output %s", err, out.String())
			}
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], c.name) {
				t.Fatalf("want one line naming %s, got %q", c.name, out.String())
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	c, err := loadConfig(func(k string) string {
		if k == "KAFKA_BROKERS" {
			return "127.0.0.1:9092, 127.0.0.1:9093"
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprintln(c.KafkaBrokers, c.KafkaTopic, c.ClickHouse.Addr, c.ClickHouse.Database, c.MeterAddr, c.StallAfter)
	want := "[127.0.0.1:9092 127.0.0.1:9093] ratelimit.decisions 127.0.0.1:9000 ratelimit 127.0.0.1:8082 2m0s\n"
	if got != want {
		t.Fatalf("defaults %q, want %q", got, want)
	}
}
