// Command envoydata writes RateLimitRequests for ghz's --binary-file: n
// length-delimited (count-prefixed) messages, each with one descriptor
// [{key, <prefix><i>}] of domain bench, or n copies of one descriptor when
// -same is set. Binary data spares ghz from rendering JSON templates on
// every call, which costs the load tool more CPU than the server spends.
//
// With -grpc-frame it writes instead the body of one gRPC call (the first
// message behind gRPC's 5-byte frame header: not compressed, its length),
// for an HTTP/2 load tool that sends one fixed body (h2load -d).
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"

	"google.golang.org/protobuf/encoding/protodelim"

	"github.com/ratewarden/ratewarden/bench/rlsreq"
)

func main() {
	n := flag.Int("n", 10000, "messages")
	domain := flag.String("domain", "bench", "domain")
	value := flag.String("value", "acct_", "the entry's value (a prefix, followed by the message number, unless -same)")
	same := flag.Bool("same", false, "every message has the same descriptor (value as given)")
	frame := flag.Bool("grpc-frame", false, "write one gRPC-framed message (an HTTP/2 request body) instead")
	out := flag.String("o", "", "output file")
	flag.Parse()
	f, err := os.Create(*out)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	w := bufio.NewWriter(f)
	reqs := rlsreq.Requests(*n, *domain, *value, *same)
	if *frame {
		b, err := rlsreq.Frame(reqs[0])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		w.Write(b)
		reqs = nil
	}
	for _, req := range reqs {
		if _, err := protodelim.MarshalTo(w, req); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	if err := w.Flush(); err != nil || f.Close() != nil {
		fmt.Fprintln(os.Stderr, "write", *out, err)
		os.Exit(1)
	}
}
