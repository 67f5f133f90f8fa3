// Package listenaddr says whether a listen address can be reached from
// beyond the host: the rule a binary uses to refuse serving an operator's
// endpoint without a token on an address others can reach.
package listenaddr

import (
	"net"
	"strings"
)

// Loopback reports whether the listen address hostport (host:port, as
// net.Listen takes it) accepts connections from this host only: a
// loopback IP (127.0.0.0/8, ::1) or "localhost". An empty host, 0.0.0.0,
// ::, any other IP and any other name (which may resolve to anything, and
// may change) are not loopback; so is an address that does not parse.
func Loopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
