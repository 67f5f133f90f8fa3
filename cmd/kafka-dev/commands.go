package main

import "github.com/ratewarden/ratewarden/internal/cli"

// program is kafka-dev's words: none (it serves) or help; internal/cli
// refuses any other word with usage and exit 2 before it listens.
func program() cli.Program {
	return cli.Program{
		Name: "kafka-dev",
		Doc: `Runs a Kafka-protocol broker on a loopback port with the decisions topic
created, until SIGTERM or SIGINT; in memory, or under KAFKA_DEV_DATA_DIR so
that a restart keeps its topics. It takes no arguments: KAFKA_DEV_ADDR,
KAFKA_TOPIC, KAFKA_DEV_PARTITIONS, KAFKA_DEV_DATA_DIR and the
KAFKA_DEV_SASL_* and KAFKA_DEV_TLS_* variables configure it (see the package
comment).`,
		Serve: serve,
	}
}
