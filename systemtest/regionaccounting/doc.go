// Package regionaccounting holds the accounting tests of a deployment in
// several regions: limiters of three regions emitting into one decisions
// topic, one meter-consumer and one ClickHouse, the usage API and the
// soft-limit notifier on top, all real servers (testkit/testenv). It has
// no code of its own.
package regionaccounting
