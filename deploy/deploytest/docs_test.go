package deploytest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/ratewarden/ratewarden/testkit/repo"
)

// The documentation's own checks: every link and every cited section
// exists, no page of docs/ is too long to read, nothing points outside
// the repository, and docs/reference.md lists every variable the code
// reads, every metric it declares, every alert rule and every CLI verb —
// the code is the one place for these facts, and the page cannot drift
// from it.

// maxDocLines is about the most a page of docs/ may hold and stay
// readable: a longer one is split into pages of one topic each.
const maxDocLines = 520

// repoFiles returns the repository's files (relative, slash-separated)
// whose names pass keep, without .git, run/ and bin/.
func repoFiles(t *testing.T, keep func(string) bool) []string {
	t.Helper()
	root := repo.Root(t)
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == ".git" || rel == "run" || rel == "bin" || strings.HasPrefix(d.Name(), ".") && rel != "." {
				return filepath.SkipDir
			}
			return nil
		}
		if keep(rel) {
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func readRepo(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo.Root(t), filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func isMarkdown(rel string) bool { return strings.HasSuffix(rel, ".md") }

// isText is what may cite a document: sources, scripts, configuration.
func isText(rel string) bool {
	for _, ext := range []string{".go", ".sh", ".yml", ".yaml", ".md", ".sql", ".json", ".txt"} {
		if strings.HasSuffix(rel, ext) {
			return true
		}
	}
	return filepath.Base(rel) == "Makefile" || filepath.Base(rel) == "Dockerfile"
}

var (
	heading = regexp.MustCompile(`^(#{1,6}) (.*)$`)
	mdLink  = regexp.MustCompile(`\]\(([^)\s]+)\)`)
)

// headings returns a Markdown file's headings (outside code fences) and
// the anchors GitHub gives them.
func headings(text string) (titles []string, anchors map[string]bool) {
	anchors = map[string]bool{}
	seen := map[string]int{}
	fence := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
			continue
		}
		m := heading.FindStringSubmatch(line)
		if fence || m == nil {
			continue
		}
		title := strings.TrimSpace(m[2])
		titles = append(titles, title)
		a := slug(title)
		if n := seen[a]; n > 0 {
			anchors[a+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return titles, anchors
}

// slug is GitHub's anchor of a heading: lower case, punctuation dropped,
// spaces turned into hyphens.
func slug(title string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(title) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestSlug(t *testing.T) {
	for title, want := range map[string]string{
		"Upgrading across the bucket layout change (`:b:` → `:b2:`)": "upgrading-across-the-bucket-layout-change-b--b2",
		"`deploy/policy.yaml`, explained":                            "deploypolicyyaml-explained",
		"Dedicated capacity (`REDIS_STORES`)":                        "dedicated-capacity-redis_stores",
		"POST /check":                                                "post-check",
	} {
		if got := slug(title); got != want {
			t.Errorf("slug(%q) = %q, want %q", title, got, want)
		}
	}
}

// TestDocLinks: every relative link of every Markdown file names a file
// that exists and, with a #fragment, a heading of it.
func TestDocLinks(t *testing.T) {
	root := repo.Root(t)
	anchorsOf := map[string]map[string]bool{}
	anchors := func(rel string) map[string]bool {
		if a, ok := anchorsOf[rel]; ok {
			return a
		}
		_, a := headings(readRepo(t, rel))
		anchorsOf[rel] = a
		return a
	}
	for _, rel := range repoFiles(t, isMarkdown) {
		text := readRepo(t, rel)
		fence := false
		for n, line := range strings.Split(text, "\n") {
			if strings.HasPrefix(line, "```") {
				fence = !fence
			}
			if fence {
				continue
			}
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, frag, _ := strings.Cut(target, "#")
				dest := rel
				if file != "" {
					dest = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(rel), file)))
					if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(dest))); err != nil {
						t.Errorf("%s:%d: link to %s: no such file", rel, n+1, target)
						continue
					}
				}
				if frag != "" && isMarkdown(dest) && !anchors(dest)[frag] {
					t.Errorf("%s:%d: link to %s: %s has no heading #%s", rel, n+1, target, dest, frag)
				}
			}
		}
	}
}

// A citation of a section in prose or a comment: docs/x.md, "Section"
// (the quoted text may run over a comment's line break).
var citation = regexp.MustCompile(`\b((?:docs/[a-z0-9-]+|README)(?:\.md)?),?\s+"((?:[^"\n]|\n\s*(?://|#)?\s*){1,80}?)"`)

var commentBreak = regexp.MustCompile(`\s*\n\s*(?://|#)?\s*`)

// anchoredCitation is citation at the start of a text.
var anchoredCitation = regexp.MustCompile(`^` + citation.String()[len(`\b`):])

// citationsIn is citation.FindAllStringSubmatch(text, -1), with the
// regexp run only where a citation can start (a "docs/" or "README"
// after a non-word character): run over every byte of every file it
// took most of this package's time under the race detector.
func citationsIn(text string) [][]string {
	var out [][]string
	for p := 0; p < len(text); {
		d, r := strings.Index(text[p:], "docs/"), strings.Index(text[p:], "README")
		switch {
		case d < 0 && r < 0:
			return out
		case d < 0 || r >= 0 && r < d:
			d = r
		}
		p += d
		if p > 0 && isWordByte(text[p-1]) {
			p++
			continue
		}
		m := anchoredCitation.FindStringSubmatch(text[p:min(len(text), p+2000)])
		if m == nil {
			p++
			continue
		}
		out = append(out, m)
		p += len(m[0])
	}
	return out
}

func isWordByte(c byte) bool {
	return c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

// TestDocSectionCitations: every `docs/x.md, "Section"` or `README,
// "Section"` in the repository names a file that exists and a heading of
// it that starts with Section.
func TestDocSectionCitations(t *testing.T) {
	t.Parallel()
	titlesOf := map[string][]string{}
	for _, rel := range repoFiles(t, isText) {
		if rel == "deploy/deploytest/docs_test.go" {
			continue
		}
		text := readRepo(t, rel)
		for _, m := range citationsIn(text) {
			file := m[1]
			if !strings.HasSuffix(file, ".md") {
				file += ".md"
			}
			section := strings.ToLower(strings.Trim(commentBreak.ReplaceAllString(m[2], " "), " .,"))
			titles, ok := titlesOf[file]
			if !ok {
				b, err := os.ReadFile(filepath.Join(repo.Root(t), filepath.FromSlash(file)))
				if err != nil {
					t.Errorf("%s cites %s, %q: no such file", rel, file, section)
					continue
				}
				titles, _ = headings(string(b))
				titlesOf[file] = titles
			}
			found := false
			for _, h := range titles {
				if strings.HasPrefix(strings.ToLower(strings.ReplaceAll(h, "`", "")), strings.ReplaceAll(section, "`", "")) {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s cites %s, %q: no heading starts so", rel, file, section)
			}
		}
	}
}

// TestCitationsInIsTheRegexp: citationsIn finds what the regexp finds.
func TestCitationsInIsTheRegexp(t *testing.T) {
	cases := []string{
		`see docs/spool.md, "Loss bound" for why`,
		`README, "Testing"`,
		`xdocs/spool.md, "Not one" and _README "no"`,
		"// as docs/metering.md, \"Exact\n// totals\" says, and README \"Testing\"",
		`docs/a.md "one" docs/b.md "two"docs/c.md, "three"`,
		`docs/ "no file" docs/x "unterminated`,
		`(docs/regions.md "Global ` + "\"" + `README, "x"`,
	}
	cases = append(cases, strings.Join(cases, "\n"))
	for _, text := range cases {
		if got, want := citationsIn(text), citation.FindAllStringSubmatch(text, -1); !reflect.DeepEqual(got, want) {
			t.Errorf("%q: citationsIn found %q, the regexp %q", text, got, want)
		}
	}
}

// TestDocPagesAreShort: no page of docs/ is over maxDocLines lines.
func TestDocPagesAreShort(t *testing.T) {
	for _, rel := range repoFiles(t, func(rel string) bool { return strings.HasPrefix(rel, "docs/") && isMarkdown(rel) }) {
		if n := strings.Count(readRepo(t, rel), "\n"); n > maxDocLines {
			t.Errorf("%s has %d lines, more than %d: split it by topic", rel, n, maxDocLines)
		}
	}
}

// TestRepositoryStandsAlone: nothing cites the contract file that lives
// outside the repository, and the benchmark page names no temporary path.
func TestRepositoryStandsAlone(t *testing.T) {
	contract := "CONTRACT" + ".md"
	for _, rel := range repoFiles(t, isText) {
		if strings.Contains(readRepo(t, rel), contract) {
			t.Errorf("%s cites %s, a file outside the repository: say it in the repository's docs (docs/reference.md)", rel, contract)
		}
	}
	for _, rel := range []string{"BENCHMARKS.md"} {
		for n, line := range strings.Split(readRepo(t, rel), "\n") {
			if strings.Contains(line, "/tmp/") || strings.Contains(line, "/work/") {
				t.Errorf("%s:%d names a path outside the repository: %s", rel, n+1, line)
			}
		}
	}
}

// envReaders are the calls whose first argument, a string literal, is
// the name of an environment variable: internal/envconfig's Reader
// methods, os.Getenv and os.LookupEnv, and the getter functions the
// configuration loaders are given.
var envReaders = map[string]bool{"String": true, "List": true, "Int": true, "Float": true, "Duration": true,
	"Bool": true, "Secret": true, "Raw": true, "HostPort": true, "Getenv": true, "LookupEnv": true, "get": true, "getenv": true}

var envName = regexp.MustCompile(`^[A-Z][A-Z0-9]*(_[A-Z0-9]+)+$`)

// testOnly are the packages whose variables only tests and benchmarks read.
func testOnly(rel string) bool {
	for _, p := range []string{"testkit/testenv/", "testkit/clitest/", "testkit/hostile/", "bench/", "testkit/otlptest/"} {
		if strings.HasPrefix(rel, p) {
			return true
		}
	}
	return strings.HasSuffix(rel, "_test.go")
}

// variablesRead returns the environment variables the binaries' code
// reads, from its syntax: the literal first argument of a reader call,
// the Var* constants of a package that names its variables so, and the
// TLS family of a prefix given to internal/tlsconf (PREFIX_TLS,
// PREFIX_TLS_CA_FILE, ...). A secret read with Secret also has its
// _FILE form.
func variablesRead(t *testing.T) map[string]string {
	clear(secretFile)
	out := map[string]string{}
	fset := token.NewFileSet()
	for _, rel := range repoFiles(t, func(rel string) bool { return strings.HasSuffix(rel, ".go") && !testOnly(rel) }) {
		f, err := parser.ParseFile(fset, filepath.Join(repo.Root(t), filepath.FromSlash(rel)), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		lit := func(e ast.Expr) string {
			if b, ok := e.(*ast.BasicLit); ok && b.Kind == token.STRING {
				if s, err := strconv.Unquote(b.Value); err == nil {
					return s
				}
			}
			return ""
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				var name, pkg string
				switch fn := n.Fun.(type) {
				case *ast.SelectorExpr:
					name = fn.Sel.Name
					if id, ok := fn.X.(*ast.Ident); ok {
						pkg = id.Name
					}
				case *ast.Ident:
					name = fn.Name
				}
				if pkg == "tlsconf" {
					for _, a := range n.Args {
						if s := lit(a); envName.MatchString(s) {
							out[s] = rel
						} else if s != "" && strings.ToUpper(s) == s {
							for _, suffix := range []string{"_TLS", "_TLS_CA_FILE", "_TLS_CERT_FILE", "_TLS_KEY_FILE", "_TLS_SERVER_NAME", "_TLS_MIN_VERSION"} {
								out[s+suffix] = rel
							}
						}
					}
					return true
				}
				if !envReaders[name] || len(n.Args) == 0 {
					return true
				}
				if s := lit(n.Args[0]); envName.MatchString(s) {
					out[s] = rel
					if name == "Secret" {
						out[s+"_FILE"] = rel
						secretFile[s+"_FILE"] = true
					}
				}
			case *ast.ValueSpec:
				for i, id := range n.Names {
					if strings.HasPrefix(id.Name, "Var") && i < len(n.Values) {
						if s := lit(n.Values[i]); envName.MatchString(s) {
							out[s] = rel
						}
					}
				}
			}
			return true
		})
	}
	return out
}

// secretFile are the _FILE forms variablesRead found through Secret.
var secretFile = map[string]bool{}

// TestReferenceListsEveryVariable: every variable the code reads is in
// docs/reference.md, as `NAME`.
func TestReferenceListsEveryVariable(t *testing.T) {
	t.Parallel()
	ref := readRepo(t, "docs/reference.md")
	vars := variablesRead(t)
	if len(vars) < 50 {
		t.Fatalf("found only %d variables read by the code: the scan is broken", len(vars))
	}
	for name, rel := range vars {
		// A secret's _FILE form is the rule "Every binary" states once.
		if base, ok := strings.CutSuffix(name, "_FILE"); ok && secretFile[name] && strings.Contains(ref, "`"+base+"`") {
			continue
		}
		if !strings.Contains(ref, "`"+name+"`") {
			t.Errorf("%s reads %s, which docs/reference.md does not list", rel, name)
		}
	}
}

// TestReferenceListsEveryMetricAndAlert: every declared metric, every
// alert rule and every verb of the limiter's command table is in
// docs/reference.md.
func TestReferenceListsEveryMetricAndAlert(t *testing.T) {
	ref := readRepo(t, "docs/reference.md")
	decl := map[string]bool{}
	for n := range declaredNames(t) {
		if strings.Contains(n, "_") && strings.ToLower(n) == n { // a command table's Name: is no metric
			decl[n] = true
		}
	}
	if len(decl) < 50 {
		t.Fatalf("found only %d declared metrics: the scan is broken", len(decl))
	}
	for name := range decl {
		if !strings.Contains(ref, "`"+name+"`") {
			t.Errorf("metric %s is declared in the code but not listed in docs/reference.md", name)
		}
	}
	alert := regexp.MustCompile(`(?m)^\s*- alert:\s*(\S+)`)
	for _, rel := range repoFiles(t, func(rel string) bool {
		return strings.HasPrefix(rel, "deploy/prometheus/rules/") && strings.HasSuffix(rel, ".yml") && !strings.HasSuffix(rel, "_test.yml")
	}) {
		for _, m := range alert.FindAllStringSubmatch(readRepo(t, rel), -1) {
			if !strings.Contains(ref, "`"+m[1]+"`") {
				t.Errorf("alert %s (%s) is not listed in docs/reference.md", m[1], rel)
			}
		}
	}
	// The command table: a group ({Name: "policy", Summary: ..., Sub:) and
	// its verbs ({Name: "check", Args: ...}).
	cmds := readRepo(t, "cmd/limiter/commands.go")
	entry := regexp.MustCompile(`\{Name: "([a-z-]+)", (Summary|Args)`)
	group := ""
	for _, m := range entry.FindAllStringSubmatch(cmds, -1) {
		if m[2] == "Summary" {
			group = m[1]
			continue
		}
		if verb := "limiter " + group + " " + m[1]; !strings.Contains(ref, "`"+verb) {
			t.Errorf("%s is in the command table but not in docs/reference.md", verb)
		}
	}
}
