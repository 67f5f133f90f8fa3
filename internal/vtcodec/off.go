//go:build !vtprotobuf

package vtcodec

import "google.golang.org/grpc"

// Enabled reports whether the binary was built with the vtprotobuf tag.
const Enabled = false

// ServerOptions is empty without the vtprotobuf build tag.
func ServerOptions() []grpc.ServerOption { return nil }
