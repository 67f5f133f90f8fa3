// Package vtcodec is the gRPC server's codec: it marshals the messages
// that carry generated fast-path code (go-control-plane's vtprotobuf
// methods, compiled in with the `vtprotobuf` build tag) with that code
// instead of protobuf reflection, and leaves everything else, and every
// unmarshal, to grpc-go's proto codec. go-control-plane ships marshalers
// and sizers only (no UnmarshalVT), so requests decode as before.
//
// Built without the tag, ServerOptions is empty and the server keeps
// grpc-go's codec: the default build still works, only slower.
package vtcodec
