package rlsserver

import (
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratewarden/ratewarden/internal/tlsconf"
)

// Optional TLS on the limiter's own listeners, for deployments without a
// service mesh: LIMITER_TLS_CERT_FILE and LIMITER_TLS_KEY_FILE (both or
// neither) make /check and the rest of the HTTP listener (LIMITER_ADDR)
// and the Envoy rate limit service (LIMITER_GRPC_ADDR) serve TLS with that
// certificate; SIGHUP re-reads the pair (a renewed certificate is served
// to new connections, no restart). Off by default.

// creds are the gRPC server's transport credentials: TLS with the
// listener certificate, or plain text when there is none.
func creds(cert *tlsconf.ServerCert) credentials.TransportCredentials {
	if cert == nil {
		return insecure.NewCredentials()
	}
	return credentials.NewTLS(cert.Config())
}
