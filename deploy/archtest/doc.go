// Package archtest keeps the repository's layers true. Its tests (there is
// no library code) read the import graph from `go list -json ./...` and
// fail when:
//
//   - a utility under internal/ imports a domain package (enforcement,
//     metering, policy, policylog, limits, schema), a binary's wiring
//     (cmd/...) or a test tool (testkit/...);
//   - the enforcement package imports anything but limits and the standard
//     library, or one of its subpackages imports metering, policylog or
//     schema (policy: only the Envoy adapter, enforcement/envoyrls);
//   - enforcement and metering import each other;
//   - a domain package imports a binary's wiring (cmd/...) or a test tool;
//   - a product binary (limiter, meter-consumer, usage-api) imports a test
//     tool;
//   - README.md's "Code layout" names a folder that does not exist, leaves
//     out a top-level folder or a layer's folder, or claims imports
//     ("imports: standard library, limits") its package exceeds.
//
// Only the code that ships is checked (a package's Imports, not its
// tests'): tests may reach across layers to set up real servers. The tests
// start nothing, so `make check` (-short) runs them, as does `make test`.
package archtest
