package deploytest

import (
	"encoding/json"
	"fmt"
	"mime"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/ratewarden/ratewarden/metering/billing/billingapi"
	"github.com/ratewarden/ratewarden/metering/usage"
	"github.com/ratewarden/ratewarden/policylog/opsapi"
	"github.com/ratewarden/ratewarden/support"
	"github.com/ratewarden/ratewarden/testkit/repo"
)

// apiDoc is an OpenAPI 3 document, decoded generically.
type apiDoc struct {
	name string
	root map[string]any
}

func loadAPI(t *testing.T, file string) apiDoc {
	t.Helper()
	docs := yamlDocs(t, filepath.Join(repo.Root(t), "api", "openapi", file))
	d := apiDoc{name: file, root: docs[0]}
	if v := asString(d.root["openapi"]); !strings.HasPrefix(v, "3.") {
		t.Fatalf("%s: openapi %q, want 3.x", file, v)
	}
	return d
}

// resolve follows a local $ref ("#/components/...").
func (d apiDoc) resolve(t *testing.T, v map[string]any) map[string]any {
	for i := 0; i < 10 && v != nil; i++ {
		ref := asString(v["$ref"])
		if ref == "" {
			return v
		}
		var cur any = d.root
		for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			cur = asMap(cur)[part]
		}
		if cur == nil {
			t.Fatalf("%s: unresolved $ref %s", d.name, ref)
		}
		v = asMap(cur)
	}
	return v
}

type operation struct {
	path, method string
	op           map[string]any
}

func (d apiDoc) operations() []operation {
	var ops []operation
	for path, item := range asMap(d.root["paths"]) {
		for method, op := range asMap(item) {
			switch method {
			case "get", "post", "put", "patch", "delete":
				ops = append(ops, operation{path, strings.ToUpper(method), asMap(op)})
			}
		}
	}
	sort.Slice(ops, func(i, j int) bool { return ops[i].path+ops[i].method < ops[j].path+ops[j].method })
	return ops
}

// needsAuth says whether the operation requires a bearer token (security
// without an empty alternative).
func (d apiDoc) needsAuth(op map[string]any) bool {
	sec, ok := op["security"]
	if !ok {
		sec = d.root["security"]
	}
	list := asList(sec)
	if len(list) == 0 {
		return false
	}
	for _, alt := range list {
		if len(asMap(alt)) == 0 {
			return false
		}
	}
	return true
}

// checkValue compares a decoded JSON value with a schema: every required
// property is there, and every property the server sent is documented.
func (d apiDoc) checkValue(t *testing.T, where string, schema map[string]any, v any) {
	schema = d.resolve(t, schema)
	if v == nil {
		if schema["nullable"] != true && len(schema) > 0 {
			t.Errorf("%s: null, but the schema is not nullable", where)
		}
		return
	}
	switch asString(schema["type"]) {
	case "object":
		obj, ok := v.(map[string]any)
		if !ok {
			t.Errorf("%s: got %T, want an object", where, v)
			return
		}
		props := asMap(schema["properties"])
		for _, r := range asList(schema["required"]) {
			if _, ok := obj[asString(r)]; !ok {
				t.Errorf("%s: documented field %q is missing from the real answer", where, r)
			}
		}
		if len(props) > 0 && schema["additionalProperties"] != true {
			for k, val := range obj {
				p, ok := props[k]
				if !ok {
					t.Errorf("%s: the real answer has field %q, which is not documented", where, k)
					continue
				}
				d.checkValue(t, where+"."+k, asMap(p), val)
			}
		}
	case "array":
		arr, ok := v.([]any)
		if !ok {
			t.Errorf("%s: got %T, want an array", where, v)
			return
		}
		for i, item := range arr {
			if i == 5 {
				break
			}
			d.checkValue(t, fmt.Sprintf("%s[%d]", where, i), asMap(schema["items"]), item)
		}
	case "string":
		if _, ok := v.(string); !ok {
			t.Errorf("%s: got %T, want a string", where, v)
		} else if enum := asList(schema["enum"]); len(enum) > 0 && !contains(enum, v) {
			t.Errorf("%s: %v is not one of the documented values %v", where, v, enum)
		}
	case "integer", "number":
		if _, ok := v.(float64); !ok {
			t.Errorf("%s: got %T, want a number", where, v)
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			t.Errorf("%s: got %T, want a boolean", where, v)
		}
	}
}

func contains(list []any, v any) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// checkAnswer checks that status is documented for the operation and that
// the body matches the documented content.
func (d apiDoc) checkAnswer(t *testing.T, o operation, status int, ctype string, body []byte) {
	where := fmt.Sprintf("%s %s %s → %d", d.name, o.method, o.path, status)
	resp := asMap(asMap(o.op["responses"])[fmt.Sprint(status)])
	if resp == nil {
		t.Errorf("%s: status not documented (body %.200s)", where, body)
		return
	}
	resp = d.resolve(t, resp)
	content := asMap(resp["content"])
	if len(content) == 0 {
		return
	}
	mt, _, _ := mime.ParseMediaType(ctype)
	media := asMap(content[mt])
	if media == nil {
		t.Errorf("%s: Content-Type %q is not documented (documented: %v)", where, ctype, keys(content))
		return
	}
	if mt != "application/json" {
		return
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		t.Errorf("%s: body is not JSON: %v", where, err)
		return
	}
	d.checkValue(t, where, asMap(media["schema"]), v)
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

var pathParam = regexp.MustCompile(`\{([^}]+)\}`)

// exercise sends each documented operation, built from the document's
// examples, to the real server: it must answer a documented 2xx status
// (never 404 or 405) with the documented fields; operations that need a
// token must answer 401 without one.
// prepare, when given, runs before each operation (to create what the
// example reads or deletes).
func (d apiDoc) exercise(t *testing.T, base, token string, pathValues map[string]string, prepare ...func(o operation)) {
	for _, o := range d.operations() {
		for _, p := range prepare {
			p(o)
		}
		u := pathParam.ReplaceAllStringFunc(o.path, func(m string) string {
			name := m[1 : len(m)-1]
			if v, ok := pathValues[name]; ok {
				return url.PathEscape(v)
			}
			for _, p := range asList(o.op["parameters"]) {
				p := d.resolve(t, asMap(p))
				if asString(p["name"]) == name && asString(p["in"]) == "path" {
					return url.PathEscape(fmt.Sprint(p["example"]))
				}
			}
			t.Errorf("%s %s: no example for path parameter %s", o.method, o.path, name)
			return "x"
		})
		q := url.Values{}
		for _, p := range asList(o.op["parameters"]) {
			p := d.resolve(t, asMap(p))
			if asString(p["in"]) == "query" && p["example"] != nil {
				q.Set(asString(p["name"]), fmt.Sprint(p["example"]))
			}
		}
		if len(q) > 0 {
			u += "?" + q.Encode()
		}
		var body []byte
		if rb := asMap(o.op["requestBody"]); rb != nil {
			ex := asMap(asMap(asMap(rb)["content"])["application/json"])["example"]
			if ex == nil {
				t.Errorf("%s %s: the request body has no example", o.method, o.path)
				continue
			}
			if o.op["x-reserve-first"] == true {
				ex = withReservation(t, base, token, asMap(ex))
			}
			if o.op["x-lease-first"] == true {
				ex = withLease(t, base, token, asMap(ex))
			}
			var err error
			if body, err = json.Marshal(ex); err != nil {
				t.Fatal(err)
			}
		}
		tok := ""
		if d.needsAuth(o.op) {
			tok = token
		}
		st, h, out := do(t, o.method, base+u, tok, body)
		if st < 200 || st > 299 {
			t.Errorf("%s %s (%s): %d %.300s; want a 2xx answer to the documented example", o.method, o.path, u, st, out)
		}
		d.checkAnswer(t, o, st, h.Get("Content-Type"), out)
		if d.needsAuth(o.op) {
			st, h, out := do(t, o.method, base+u, "", body)
			if st != 401 {
				t.Errorf("%s %s without a token: %d, want 401", o.method, o.path, st)
			}
			d.checkAnswer(t, o, st, h.Get("Content-Type"), out)
		}
	}
}

// documented is the set of "METHOD /path" of a document.
func (d apiDoc) documented() map[string]bool {
	out := map[string]bool{}
	for _, o := range d.operations() {
		out[o.method+" "+o.path] = true
	}
	return out
}

var ginParam = regexp.MustCompile(`[:*]([A-Za-z_]+)`)

func checkOpenAPI(t *testing.T, s *stack) {
	t.Run("limiter", func(t *testing.T) {
		d := loadAPI(t, "limiter.yaml")
		d.exercise(t, s.limiter, "", nil)
		// Errors of POST /check follow the documented Error schema.
		o := operation{"/check", "POST", asMap(asMap(asMap(d.root["paths"])["/check"])["post"])}
		for _, body := range []string{`{}`, `{"key":"k","scope":"s","cost":-1}`, `{"key":"k","scope":"s","cost":1000000}`, `not json`} {
			st, h, out := do(t, "POST", s.limiter+"/check", "", []byte(body))
			if st != 400 {
				t.Errorf("POST /check %s: %d, want 400", body, st)
			}
			d.checkAnswer(t, o, st, h.Get("Content-Type"), out)
		}
		st, h, out := do(t, "GET", s.limiter+"/check", "", nil)
		d.checkAnswer(t, o, st, h.Get("Content-Type"), out)
		// Every route the binary registers is documented (cmd/limiter/run.go).
		src, err := os.ReadFile(filepath.Join(repo.Root(t), "cmd", "limiter", "run.go"))
		if err != nil {
			t.Fatal(err)
		}
		doc := d.documented()
		re := regexp.MustCompile(`mux\.Handle(?:Func)?\("(?:([A-Z]+) )?(/[^"]*)"`)
		n := 0
		for _, m := range re.FindAllStringSubmatch(string(src), -1) {
			n++
			method, path := m[1], m[2]
			if method == "" {
				found := false
				for k := range doc {
					found = found || strings.HasSuffix(k, " "+path)
				}
				if !found {
					t.Errorf("limiter route %s is not in limiter.yaml", path)
				}
				continue
			}
			if !doc[method+" "+path] {
				t.Errorf("limiter route %s %s is not in limiter.yaml", method, path)
			}
		}
		if n < 4 {
			t.Errorf("found %d routes in cmd/limiter/run.go; the pattern no longer matches the code", n)
		}
	})

	t.Run("meter-consumer", func(t *testing.T) {
		loadAPI(t, "meter-consumer.yaml").exercise(t, s.meter, "", nil)
	})

	t.Run("usage-api", func(t *testing.T) {
		d := loadAPI(t, "usage-api.yaml")
		mint := func() (id, token string) {
			st, _, out := do(t, "POST", s.usage+"/v1/admin/portal-tokens", s.admin, []byte(`{"key":"deploytest_free","ttl_seconds":600}`))
			var tok struct{ ID, Token string }
			if st != 201 || json.Unmarshal(out, &tok) != nil || tok.ID == "" {
				t.Fatalf("mint a portal token: %d %s", st, out)
			}
			return tok.ID, tok.Token
		}
		// A real portal token id, so DELETE revokes something.
		revokeID, _ := mint()
		// The policy log's document and override that the policy API's
		// examples read, roll back and delete.
		seed := func(o operation) {
			switch o.method + " " + o.path {
			case "DELETE /v1/admin/overrides/{key}", "GET /v1/admin/overrides/{key}", "GET /v1/admin/overrides", "GET /v1/admin/policy":
				doc := map[string]any{"document": "version: 1\ndefault_tier: free\ntiers:\n  free: { rate: 10, burst: 20 }\n", "message": "seed", "author": "deploytest"}
				ov := map[string]any{"tier": "free", "reason": "seed", "author": "deploytest"}
				for _, w := range []struct {
					path string
					body map[string]any
				}{{"/v1/admin/policy", doc}, {"/v1/admin/overrides/acct_deploytest", ov}} {
					b, _ := json.Marshal(w.body)
					if st, _, out := do(t, "PUT", s.usage+w.path, s.admin, b); st != 200 {
						t.Fatalf("seed the policy log: PUT %s: %d %s", w.path, st, out)
					}
				}
			}
		}
		d.exercise(t, s.usage, s.admin, map[string]string{"id": revokeID}, seed)
		var tok struct{ ID, Token string }
		tok.ID, tok.Token = mint()
		// A portal token reads its own key and nothing else.
		getUsage := operation{"/v1/usage", "GET", asMap(asMap(asMap(d.root["paths"])["/v1/usage"])["get"])}
		st, h, out := do(t, "GET", s.usage+"/v1/usage?window=minute&group_by=scope", tok.Token, nil)
		d.checkAnswer(t, getUsage, st, h.Get("Content-Type"), out)
		if st != 200 || !strings.Contains(string(out), `"requests"`) {
			t.Errorf("portal token GET /v1/usage: %d %s", st, out)
		}
		st, h, out = do(t, "GET", s.usage+"/v1/usage?key=acct_8812", tok.Token, nil)
		if st != 403 {
			t.Errorf("portal token reading another key: %d, want 403", st)
		}
		d.checkAnswer(t, getUsage, st, h.Get("Content-Type"), out)
		st, h, out = do(t, "GET", s.usage+"/v1/usage?key=x&window=fortnight", s.admin, nil)
		if st != 400 {
			t.Errorf("bad window: %d, want 400", st)
		}
		d.checkAnswer(t, getUsage, st, h.Get("Content-Type"), out)

		// Every route of the real gin engine is documented, and the reverse.
		gin.SetMode(gin.ReleaseMode)
		conn := s.ch.Conn(t)
		store, err := usage.NewStore(conn, s.db)
		if err != nil {
			t.Fatal(err)
		}
		signer, err := usage.NewSigner([]byte("0123456789abcdef0123456789abcdef"))
		if err != nil {
			t.Fatal(err)
		}
		srv, err := usage.New(usage.Config{Store: store, Signer: signer, AdminToken: "0123456789abcdef-admin"})
		if err != nil {
			t.Fatal(err)
		}
		eng, ok := srv.Handler().(*gin.Engine)
		if !ok {
			t.Fatalf("usage handler is %T, want *gin.Engine", srv.Handler())
		}
		doc := d.documented()
		real := map[string]bool{}
		for _, r := range eng.Routes() {
			k := r.Method + " " + ginParam.ReplaceAllString(r.Path, "{$1}")
			real[k] = true
			if !doc[k] {
				t.Errorf("usage API route %s is not in usage-api.yaml", k)
			}
		}
		for _, k := range opsapi.Routes() { // the policy API beside the gin engine (cmd/usage-api/policyops.go)
			real[k] = true
			if !doc[k] {
				t.Errorf("policy API route %s is not in usage-api.yaml", k)
			}
		}
		for _, k := range billingapi.Operations() { // billing's routes beside the gin engine (cmd/usage-api/billing.go)
			real[k] = true
			if !doc[k] {
				t.Errorf("billing route %s is not in usage-api.yaml", k)
			}
		}
		for _, k := range support.DeskOperations() { // the support page's API beside the gin engine (cmd/usage-api/supportdesk.go)
			real[k] = true
			if !doc[k] {
				t.Errorf("support route %s is not in usage-api.yaml", k)
			}
		}
		for k := range doc {
			if !real[k] {
				t.Errorf("usage-api.yaml documents %s, which the server does not route", k)
			}
		}
	})
}

// withReservation is ex with its "reservation" replaced by a real one: a
// settle's documented example needs a reservation made just before.
func withReservation(t *testing.T, base, token string, ex map[string]any) map[string]any {
	t.Helper()
	st, _, out := do(t, "POST", base+"/check", token, []byte(`{"key":"openapi_reserve","scope":"api:search","cost":5,"reserve":true}`))
	var d struct {
		Reservation string `json:"reservation"`
	}
	if err := json.Unmarshal(out, &d); st != 200 || err != nil || d.Reservation == "" {
		t.Fatalf("reserve before the settle example: %d %s (%v)", st, out, err)
	}
	c := map[string]any{}
	for k, v := range ex {
		c[k] = v
	}
	c["reservation"] = d.Reservation
	return c
}

// withLease is ex with its "lease" replaced by a real one: the release's
// and renew's documented examples need a slot taken just before (the demo
// policy's reports-in-flight rule has a concurrency limit).
func withLease(t *testing.T, base, token string, ex map[string]any) map[string]any {
	t.Helper()
	st, _, out := do(t, "POST", base+"/check", token, []byte(`{"key":"openapi_lease","scope":"reports:export"}`))
	var d struct {
		Lease string `json:"lease"`
	}
	if err := json.Unmarshal(out, &d); st != 200 || err != nil || d.Lease == "" {
		t.Fatalf("take a slot before the lease example: %d %s (%v)", st, out, err)
	}
	c := map[string]any{}
	for k, v := range ex {
		c[k] = v
	}
	c["lease"] = d.Lease
	return c
}
