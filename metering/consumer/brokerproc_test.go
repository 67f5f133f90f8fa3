package consumer_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/ratewarden/ratewarden/testkit/kafkadev"
	"github.com/ratewarden/ratewarden/testkit/testenv"
)

// broker is what BenchmarkEndToEnd needs of its broker.
type broker interface {
	Addr() string
	Topic() string
}

// brokerEnv, set to "port/topic partitions", makes the re-executed test
// binary serve the broker (BenchmarkEndToEnd -meter.broker-process).
const brokerEnv = "CONSUMER_TEST_BROKER"

// serveBrokerIfAsked runs a kafkadev broker and exits when this test binary
// was started as one (TestMain calls it first).
func serveBrokerIfAsked() {
	spec := os.Getenv(brokerEnv) // port/topic/partitions
	if spec == "" {
		return
	}
	var port, parts int
	var topic string
	if _, err := fmt.Sscanf(spec, "%d/%s %d", &port, &topic, &parts); err != nil {
		fmt.Fprintln(os.Stderr, "bad", brokerEnv, spec, err)
		os.Exit(2)
	}
	b, err := kafkadev.Start(kafkadev.Config{Port: port, Topic: topic, Partitions: parts, RetentionBytes: 64 << 20})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	b.Close()
	os.Exit(0)
}

type brokerProcess struct {
	cmd   *exec.Cmd
	addr  string
	topic string
	done  chan struct{}
}

func (b *brokerProcess) Addr() string  { return b.addr }
func (b *brokerProcess) Topic() string { return b.topic }

func (b *brokerProcess) close() {
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.done:
	case <-time.After(testenv.Timeout(5 * time.Second)):
		_ = b.cmd.Process.Kill()
		<-b.done
	}
}

func startBrokerProcess(topic string, partitions int) (*brokerProcess, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), brokerEnv+"="+strconv.Itoa(port)+"/"+topic+" "+strconv.Itoa(partitions))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	b := &brokerProcess{cmd: cmd, addr: fmt.Sprintf("127.0.0.1:%d", port), topic: topic, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(b.done) }()
	deadline := time.Now().Add(testenv.Timeout(30 * time.Second))
	for {
		c := &kafka.Client{Addr: kafka.TCP(b.addr), Timeout: time.Second}
		md, err := c.Metadata(context.Background(), &kafka.MetadataRequest{Topics: []string{topic}})
		if err == nil && len(md.Topics) == 1 && len(md.Topics[0].Partitions) == partitions {
			return b, nil
		}
		if time.Now().After(deadline) {
			b.close()
			return nil, fmt.Errorf("broker process on %s: not answering: %v", b.addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
