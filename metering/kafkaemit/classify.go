package kafkaemit

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"

	"github.com/segmentio/kafka-go"
)

// classify says what a failed write's error tells of its messages:
// ReasonRefused when they cannot have been written (Kafka answered with an
// error code, or no connection could be made, or it was refused before
// the request went), ReasonUnconfirmed when they may have been (the wait
// ended first, or the connection broke with the request sent: kafka-go
// may even write them later). Doubt is never counted as refusal.
func classify(err error) string {
	var tooLarge kafka.MessageTooLargeError
	if errors.As(err, &tooLarge) {
		return ReasonRefused // refused by kafka-go before anything was sent
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return ReasonRefused // no connection, no request
	}
	var ke kafka.Error
	if errors.As(err, &ke) {
		switch ke {
		case kafka.RequestTimedOut, kafka.NotEnoughReplicasAfterAppend:
			return ReasonUnconfirmed // Kafka's own words for "written, perhaps"
		}
		return ReasonRefused
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return ReasonUnconfirmed
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return ReasonUnconfirmed
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return ReasonRefused
	}
	// Anything else (a failed TLS handshake, refused credentials, no
	// metadata for the topic) fails before a produce request is sent.
	return ReasonRefused
}

// cutOff reports an error of a connection closed under the request (not
// a timeout).
func cutOff(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// permanent reports a refusal that no resend can cure: the record itself
// is what Kafka rejects.
func permanent(reason string, err error) bool {
	if reason != ReasonRefused {
		return false
	}
	var tooLarge kafka.MessageTooLargeError
	if errors.As(err, &tooLarge) {
		return true
	}
	var ke kafka.Error
	if errors.As(err, &ke) {
		switch ke {
		case kafka.MessageSizeTooLarge, kafka.InvalidRecord, kafka.InvalidTimestamp:
			return true
		}
	}
	return false
}
