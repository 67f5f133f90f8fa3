// Package regions holds the process tests of global limits across
// regions: three regions on loopback (testkit/testenv.StartRegions), each
// its own redis-server and limiter processes, the WAN between them
// through testkit/wanproxy links with make regions-up's delays, and
// traffic sent to each region's limiters over HTTP. It has no code of its
// own: the tests are in its _test.go files, and `make test` runs them
// (`make check`, -short, skips them: they start processes).
package regions
