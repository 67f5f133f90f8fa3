// Package deploytest keeps the deployment files and the API descriptions
// true. Its tests (there is no library code) check that:
//
//   - every YAML file under deploy/ and api/ parses;
//   - every binary builds static with CGO_ENABLED=0 and the Dockerfile,
//     docker-compose.yml and the Kubernetes manifests name binaries,
//     environment variables, ports, probes and config maps that exist;
//   - every alert and recording rule in deploy/prometheus/rules and every
//     Grafana panel names only metrics the real binaries export (scraped from
//     their /metrics while they serve traffic);
//   - api/openapi/*.yaml match the real routes and answers;
//   - `make up` starts the local stack, /check traffic reaches the usage API,
//     and `make down` leaves no process behind (TestUpDown, also `make up-test`).
package deploytest
