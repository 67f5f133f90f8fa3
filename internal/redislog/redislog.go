// Package redislog routes go-redis's own log lines into log/slog.
//
// go-redis writes what it notices inside its connection pool (a failed dial,
// a connection with unread data, a recovered panic) through a package-level
// logger that prints plain text to stderr ("redis: 2026/11/30 06:00:00
// pool.go:770: ..."). Every binary here promises JSON logs on stderr, one
// object per line, so that plain line breaks the contract for log shippers.
// Use replaces that logger with one that writes through the binary's slog
// logger.
package redislog

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Default bounds on what go-redis may log: while Redis is down, every
// attempt to open a connection fails and is logged, and a limiter under load
// tries many; the log must stay readable and cheap. What is dropped is
// counted in the next line that gets through ("suppressed").
const (
	defaultBurst = 20
	defaultEvery = time.Second
)

// Use sends go-redis's internal log lines to log (as warnings, with
// "component":"go-redis"), at most a burst of 20 and then one per second;
// call it once in main, before any Redis client is made. go-redis's logger
// is process-wide, so the last call wins.
func Use(log *slog.Logger) {
	redis.SetLogger(New(log, defaultBurst, defaultEvery))
}

// Logger is go-redis's internal logging interface implemented over slog.
type Logger struct {
	log   *slog.Logger
	burst int
	every time.Duration
	now   func() time.Time

	mu         sync.Mutex
	tokens     float64
	last       time.Time
	suppressed int64
}

// New returns a Logger that writes to log, allowing burst lines at once and
// then one per every; what exceeds that is counted, not written.
func New(log *slog.Logger, burst int, every time.Duration) *Logger {
	if burst < 1 {
		burst = 1
	}
	return &Logger{log: log, burst: burst, every: every, now: time.Now, tokens: float64(burst)}
}

// Printf implements go-redis's internal.Logging.
func (l *Logger) Printf(ctx context.Context, format string, v ...any) {
	suppressed, ok := l.admit()
	if !ok {
		return
	}
	// go-redis prefixes some messages with "redis: " itself; the component
	// attribute already says where the line comes from.
	msg := strings.TrimSpace(strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: "))
	attrs := []any{"component", "go-redis"}
	if suppressed > 0 {
		attrs = append(attrs, "suppressed", suppressed)
	}
	// The context can be a caller's that is already cancelled; slog's
	// handlers only read values from it, so it is passed on as it is.
	l.log.WarnContext(ctx, msg, attrs...)
}

// admit takes a token from the line budget. It returns how many lines were
// suppressed since the last one written, and whether this one may be.
// every <= 0 means no budget: every line is written.
func (l *Logger) admit() (int64, bool) {
	if l.every <= 0 {
		return 0, true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if !l.last.IsZero() {
		l.tokens += float64(now.Sub(l.last)) / float64(l.every)
		if l.tokens > float64(l.burst) {
			l.tokens = float64(l.burst)
		}
	}
	l.last = now
	if l.tokens < 1 {
		l.suppressed++
		return 0, false
	}
	l.tokens--
	s := l.suppressed
	l.suppressed = 0
	return s, true
}
