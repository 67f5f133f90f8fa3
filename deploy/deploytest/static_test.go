package deploytest

import (
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/ratewarden/ratewarden/internal/redisclient"
	"github.com/ratewarden/ratewarden/policy"
	"github.com/ratewarden/ratewarden/testkit/repo"
)

// services are the binaries that run as long-lived services in compose and k8s.
var services = []string{"limiter", "meter-consumer", "usage-api"}

// yamlDocs decodes every document of a YAML file.
func yamlDocs(tb testing.TB, path string) []map[string]any {
	tb.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	var docs []map[string]any
	for {
		var d map[string]any
		err := dec.Decode(&d)
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			tb.Fatalf("%s: %v", path, err)
		}
		if d != nil {
			docs = append(docs, d)
		}
	}
}

func TestEveryYAMLFileParses(t *testing.T) {
	root := repo.Root(t)
	n := 0
	for _, dir := range []string{"deploy", "api"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() || !(strings.HasSuffix(path, ".yml") || strings.HasSuffix(path, ".yaml")) {
				return nil
			}
			n++
			if docs := yamlDocs(t, path); len(docs) == 0 {
				t.Errorf("%s: no YAML document", path)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if n < 10 {
		t.Fatalf("found only %d YAML files under deploy/ and api/", n)
	}
}

// TestBinariesBuildStatic: every command builds with CGO_ENABLED=0 into a
// static executable (no ELF interpreter), as the images need.
func TestBinariesBuildStatic(t *testing.T) {
	dir := buildBinaries(t)
	for _, name := range binaries {
		path := filepath.Join(dir, name)
		f, err := elf.Open(path)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s is dynamically linked (has an ELF interpreter)", name)
			}
		}
		f.Close()
		info, err := buildinfo.ReadFile(path)
		if err != nil {
			t.Errorf("%s: build info: %v", name, err)
			continue
		}
		cgo := ""
		for _, s := range info.Settings {
			if s.Key == "CGO_ENABLED" {
				cgo = s.Value
			}
		}
		if cgo != "0" {
			t.Errorf("%s: CGO_ENABLED=%q in its build info, want 0", name, cgo)
		}
	}
}

var (
	envLiteral = regexp.MustCompile(`"([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)"`)
	// secretRead is envconfig's Reader.Secret: NAME_FILE is read as well.
	secretRead = regexp.MustCompile(`\.Secret\("([A-Z][A-Z0-9_]*)"\)`)
	// internalImport is an import of one of the repository's internal
	// packages (internal/, or a binary's own under cmd/<binary>/internal/),
	// where shared configuration (internal/redisclient's REDIS_*) is read
	// on a binary's behalf.
	internalImport = regexp.MustCompile(`"github\.com/ratewarden/ratewarden/((?:cmd/[a-z0-9-]+/)?internal/[a-z0-9/]+)"`)
)

// knownEnv is the set of environment variable names a binary's main
// package mentions (its configuration code), e.g. "LIMITER_ADDR", with
// those of the internal packages it imports, and NAME_FILE for every
// secret read through envconfig's Reader.Secret.
func knownEnv(tb testing.TB, bin string) map[string]bool {
	tb.Helper()
	root := repo.Root(tb)
	out := map[string]bool{}
	seen := map[string]bool{}
	var scan func(dir string)
	scan = func(dir string) {
		if seen[dir] {
			return
		}
		seen[dir] = true
		files, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
		if err != nil || len(files) == 0 {
			tb.Fatalf("no sources in %s", dir)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			raw, err := os.ReadFile(f)
			if err != nil {
				tb.Fatal(err)
			}
			for _, m := range envLiteral.FindAllSubmatch(raw, -1) {
				out[string(m[1])] = true
			}
			for _, m := range secretRead.FindAllSubmatch(raw, -1) {
				out[string(m[1])+"_FILE"] = true
			}
			// A secret read through a constant (kafkaconn.VarPassword).
			for _, m := range secretConst.FindAllSubmatch(raw, -1) {
				out[string(m[1])+"_FILE"] = true
			}
			// tlsconf.FilesFromEnv / ClientFromEnv(e, prefix) read six variables.
			for _, m := range clientTLS.FindAllSubmatch(raw, -1) {
				for _, suffix := range []string{"_TLS", "_TLS_CA_FILE", "_TLS_CERT_FILE", "_TLS_KEY_FILE", "_TLS_SERVER_NAME", "_TLS_MIN_VERSION"} {
					out[string(m[1])+suffix] = true
				}
			}
			// redisclient.FromEnvPrefix(e, prefix) reads a set of its own.
			for _, m := range redisPrefix.FindAllSubmatch(raw, -1) {
				for _, v := range redisclient.Vars(string(m[1])) {
					out[v] = true
				}
			}
			for _, m := range internalImport.FindAllSubmatch(raw, -1) {
				scan(string(m[1]))
			}
		}
	}
	scan(filepath.Join("cmd", bin))
	return out
}

var (
	secretConst = regexp.MustCompile(`VarPassword += "([A-Z][A-Z0-9_]*)"`)
	redisPrefix = regexp.MustCompile(`FromEnvPrefix\(e, "([A-Z][A-Z0-9_]*)"[,)]`)
	clientTLS   = regexp.MustCompile(`(?:FilesFromEnv|ClientFromEnv)\(e, "([A-Z][A-Z0-9_]*)"\)`)
)

func cmdExists(tb testing.TB, bin string) bool {
	st, err := os.Stat(filepath.Join(repo.Root(tb), "cmd", bin))
	return err == nil && st.IsDir()
}

func TestDockerfile(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repo.Root(t), "deploy", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var froms []string
	var lastUser string
	userAfterLastFrom := false
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "FROM":
			froms = append(froms, line)
			userAfterLastFrom = false
		case "USER":
			lastUser, userAfterLastFrom = f[1], true
		}
	}
	if len(froms) < 2 {
		t.Errorf("Dockerfile has %d FROM lines, want a multi-stage build", len(froms))
	}
	if !userAfterLastFrom {
		t.Errorf("the final stage sets no USER")
	}
	if u := strings.SplitN(lastUser, ":", 2)[0]; u == "root" || u == "0" {
		t.Errorf("final USER is %s, want non-root", lastUser)
	}
	for _, want := range []string{"CGO_ENABLED=0", "./cmd/${BINARY}", "ARG BINARY", "/etc/ratewarden/policy.yaml"} {
		if !bytes.Contains(raw, []byte(want)) {
			t.Errorf("Dockerfile does not contain %q", want)
		}
	}
	if m := regexp.MustCompile(`ARG BINARY=(\S+)`).FindSubmatch(raw); m == nil || !cmdExists(t, string(m[1])) {
		t.Errorf("ARG BINARY default does not name a command under cmd/")
	}
	// The build context must not carry run/ (data, secrets) or bin/.
	ign, err := os.ReadFile(filepath.Join(repo.Root(t), "deploy", "Dockerfile.dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"run", "bin", ".git"} {
		if !slices.Contains(strings.Fields(string(ign)), want) {
			t.Errorf("Dockerfile.dockerignore does not exclude %s", want)
		}
	}
}

func asMap(v any) map[string]any { m, _ := v.(map[string]any); return m }
func asList(v any) []any         { l, _ := v.([]any); return l }
func asString(v any) string      { s, _ := v.(string); return s }

func portOf(addr string) string {
	i := strings.LastIndex(addr, ":")
	if i < 0 {
		return ""
	}
	return addr[i+1:]
}

// addrVars are the listen-address variables of each service.
var addrVars = map[string]string{"limiter": "LIMITER_ADDR", "meter-consumer": "METER_ADDR", "usage-api": "USAGE_API_ADDR"}

func TestCompose(t *testing.T) {
	deployDir := filepath.Join(repo.Root(t), "deploy")
	docs := yamlDocs(t, filepath.Join(deployDir, "docker-compose.yml"))
	svcs := asMap(docs[0]["services"])
	for _, infra := range []string{"redis", "kafka", "clickhouse", "prometheus", "grafana"} {
		if svcs[infra] == nil {
			t.Errorf("docker-compose.yml has no %s service", infra)
		}
	}
	kafkaEnv := asMap(asMap(svcs["kafka"])["environment"])
	if !strings.Contains(asString(kafkaEnv["KAFKA_PROCESS_ROLES"]), "controller") {
		t.Errorf("kafka is not in KRaft mode (KAFKA_PROCESS_ROLES with controller)")
	}
	for name := range svcs {
		if strings.Contains(name, "zookeeper") {
			t.Errorf("service %s: KRaft needs no ZooKeeper", name)
		}
	}
	for _, name := range services {
		s := asMap(svcs[name])
		if s == nil {
			t.Errorf("docker-compose.yml has no %s service", name)
			continue
		}
		build := asMap(s["build"])
		bin := asString(asMap(build["args"])["BINARY"])
		if bin != name || !cmdExists(t, bin) {
			t.Errorf("%s: build arg BINARY=%q, want %q (a command under cmd/)", name, bin, name)
		}
		if df := asString(build["dockerfile"]); df != "deploy/Dockerfile" {
			t.Errorf("%s: dockerfile %q, want deploy/Dockerfile", name, df)
		}
		if img := asString(s["image"]); !strings.Contains(img, "/"+name+":") {
			t.Errorf("%s: image %q does not name the binary", name, img)
		}
		known := knownEnv(t, name)
		env := asMap(s["environment"])
		for k := range env {
			if !known[k] {
				t.Errorf("%s: environment variable %s is not read by cmd/%s", name, k, name)
			}
		}
		addr := asString(env[addrVars[name]])
		if !strings.HasPrefix(addr, "0.0.0.0:") {
			t.Errorf("%s: %s=%q, want 0.0.0.0:<port> in a container", name, addrVars[name], addr)
		}
		published := false
		for _, p := range asList(s["ports"]) {
			if strings.HasSuffix(asString(p), ":"+portOf(addr)) {
				published = true
			}
		}
		if !published {
			t.Errorf("%s: listens on %s but publishes %v", name, addr, s["ports"])
		}
	}
	// Bind mounts point at files of this repository.
	for name, v := range svcs {
		for _, vol := range asList(asMap(v)["volumes"]) {
			src := strings.SplitN(asString(vol), ":", 2)[0]
			if strings.HasPrefix(src, ".") {
				if _, err := os.Stat(filepath.Join(deployDir, src)); err != nil {
					t.Errorf("%s: volume source %s: %v", name, src, err)
				}
			}
		}
	}
}

// k8sObjects decodes every object of the kustomization's resources.
func k8sObjects(tb testing.TB) []map[string]any {
	tb.Helper()
	dir := filepath.Join(repo.Root(tb), "deploy", "k8s")
	kust := yamlDocs(tb, filepath.Join(dir, "kustomization.yaml"))[0]
	var objs []map[string]any
	for _, r := range asList(kust["resources"]) {
		for _, d := range yamlDocs(tb, filepath.Join(dir, asString(r))) {
			if asString(d["apiVersion"]) == "" || asString(d["kind"]) == "" || asString(asMap(d["metadata"])["name"]) == "" {
				tb.Errorf("%s: an object without apiVersion, kind or metadata.name", r)
			}
			objs = append(objs, d)
		}
	}
	return objs
}

func objName(o map[string]any) string { return asString(asMap(o["metadata"])["name"]) }

func find(objs []map[string]any, kind, name string) map[string]any {
	for _, o := range objs {
		if asString(o["kind"]) == kind && objName(o) == name {
			return o
		}
	}
	return nil
}

func labelsMatch(selector, labels map[string]any) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func TestKubernetes(t *testing.T) {
	objs := k8sObjects(t)
	for _, name := range services {
		dep := find(objs, "Deployment", name)
		if dep == nil {
			t.Errorf("no Deployment %s", name)
			continue
		}
		spec := asMap(dep["spec"])
		tmpl := asMap(spec["template"])
		podLabels := asMap(asMap(tmpl["metadata"])["labels"])
		if !labelsMatch(asMap(asMap(spec["selector"])["matchLabels"]), podLabels) {
			t.Errorf("Deployment %s: selector does not match the pod labels", name)
		}
		pod := asMap(tmpl["spec"])
		if sc := asMap(pod["securityContext"]); sc["runAsNonRoot"] != true {
			t.Errorf("Deployment %s: pod securityContext.runAsNonRoot is not true", name)
		}
		volumes := map[string]map[string]any{}
		for _, v := range asList(pod["volumes"]) {
			volumes[asString(asMap(v)["name"])] = asMap(v)
		}
		for _, v := range volumes {
			if cm := asMap(v["configMap"]); cm != nil && find(objs, "ConfigMap", asString(cm["name"])) == nil {
				t.Errorf("Deployment %s: volume uses ConfigMap %v, which is not in the manifests", name, cm["name"])
			}
		}
		containers := asList(pod["containers"])
		if len(containers) != 1 {
			t.Errorf("Deployment %s: %d containers, want 1", name, len(containers))
			continue
		}
		c := asMap(containers[0])
		if img := asString(c["image"]); img != "ratewarden/"+name {
			t.Errorf("Deployment %s: image %q, want ratewarden/%s (tag set in kustomization.yaml)", name, img, name)
		}
		ports := map[string]string{}
		for _, p := range asList(c["ports"]) {
			ports[asString(asMap(p)["name"])] = strconv.Itoa(asMap(p)["containerPort"].(int))
		}
		known := knownEnv(t, name)
		for _, e := range asList(c["env"]) {
			e := asMap(e)
			k := asString(e["name"])
			if !known[k] {
				t.Errorf("Deployment %s: env %s is not read by cmd/%s", name, k, name)
			}
			if strings.HasSuffix(k, "_PASSWORD") {
				t.Errorf("Deployment %s: %s in the environment; mount it and set %s_FILE", name, k, k)
			}
			if k == addrVars[name] && ports["http"] != portOf(asString(e["value"])) {
				t.Errorf("Deployment %s: %s=%v but containerPort http=%s", name, k, e["value"], ports["http"])
			}
			if ref := asMap(asMap(e["valueFrom"])["configMapKeyRef"]); ref != nil {
				cm := find(objs, "ConfigMap", asString(ref["name"]))
				if cm == nil || asMap(cm["data"])[asString(ref["key"])] == nil {
					t.Errorf("Deployment %s: env %s refers to ConfigMap %v key %v, which does not exist", name, k, ref["name"], ref["key"])
				}
			}
		}
		if addr := addrVars[name]; !slices.ContainsFunc(asList(c["env"]), func(e any) bool { return asMap(e)["name"] == addr }) {
			t.Errorf("Deployment %s: %s not set (the default listens on loopback only)", name, addr)
		}
		req := asMap(asMap(c["resources"])["requests"])
		if req["cpu"] == nil || req["memory"] == nil {
			t.Errorf("Deployment %s: resource requests cpu and memory are required", name)
		}
		for _, probe := range []string{"livenessProbe", "readinessProbe"} {
			hg := asMap(asMap(c[probe])["httpGet"])
			path := asString(hg["path"])
			if path != "/healthz" && path != "/readyz" {
				t.Errorf("Deployment %s: %s path %q", name, probe, path)
			}
			if _, ok := ports[asString(hg["port"])]; !ok {
				t.Errorf("Deployment %s: %s port %v is not a named container port", name, probe, hg["port"])
			}
		}
		for _, m := range asList(c["volumeMounts"]) {
			m := asMap(m)
			if volumes[asString(m["name"])] == nil {
				t.Errorf("Deployment %s: mount of unknown volume %v", name, m["name"])
			}
			if m["subPath"] != nil {
				t.Errorf("Deployment %s: subPath mounts never see ConfigMap updates (no hot reload)", name)
			}
		}
		svc := find(objs, "Service", name)
		if svc == nil || !labelsMatch(asMap(asMap(svc["spec"])["selector"]), podLabels) {
			t.Errorf("Service %s missing or its selector does not match the Deployment's pods", name)
		}
	}
	lim := find(objs, "Deployment", "limiter")
	limLabels := asMap(asMap(asMap(asMap(lim["spec"])["template"])["metadata"])["labels"])
	pdb := find(objs, "PodDisruptionBudget", "limiter")
	if pdb == nil || !labelsMatch(asMap(asMap(asMap(pdb["spec"])["selector"])["matchLabels"]), limLabels) {
		t.Errorf("no PodDisruptionBudget selecting the limiter's pods")
	}
	hpa := find(objs, "HorizontalPodAutoscaler", "limiter")
	if hpa == nil || asMap(asMap(hpa["spec"])["scaleTargetRef"])["name"] != "limiter" || asMap(asMap(hpa["spec"])["scaleTargetRef"])["kind"] != "Deployment" {
		t.Errorf("no HorizontalPodAutoscaler targeting Deployment limiter")
	}
	cm := find(objs, "ConfigMap", "ratewarden-policy")
	if cm == nil {
		t.Fatal("no ConfigMap ratewarden-policy")
	}
	text := asString(asMap(cm["data"])["policy.yaml"])
	if _, err := policy.Parse([]byte(text)); err != nil {
		t.Errorf("the policy in ConfigMap ratewarden-policy is refused by the limiter: %v", err)
	}
}
