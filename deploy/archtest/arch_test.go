package archtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ratewarden/ratewarden/testkit/repo"
)

const module = "github.com/ratewarden/ratewarden"

// domain are the domain packages' folders: each with its subpackages.
var domain = []string{"enforcement", "metering", "policy", "policylog", "limits", "schema"}

// pkg is what `go list -json` says of one package of the module.
type pkg struct {
	ImportPath string
	Dir        string
	Imports    []string // of the non-test files only
}

// rel is p's path inside the module ("" for the module's root).
func rel(p string) string {
	if p == module {
		return ""
	}
	return strings.TrimPrefix(p, module+"/")
}

// under reports whether the module path p is folder or inside it.
func under(p, folder string) bool {
	r := rel(p)
	return strings.HasPrefix(p, module) && (r == folder || strings.HasPrefix(r, folder+"/"))
}

// isDomain reports whether the module path p is a domain package.
func isDomain(p string) bool {
	return slices.ContainsFunc(domain, func(d string) bool { return under(p, d) })
}

// isStd reports whether an import path is the standard library's: its
// first element has no dot (every module path outside it does).
func isStd(p string) bool {
	first, _, _ := strings.Cut(p, "/")
	return !strings.Contains(first, ".")
}

// ours reports whether p is a package of this module.
func ours(p string) bool { return p == module || strings.HasPrefix(p, module+"/") }

var (
	listOnce sync.Once
	listed   []pkg
	listErr  error
)

// packages lists the module's packages (bench/ is a module of its own and
// not among them), once per test binary.
func packages(t *testing.T) []pkg {
	t.Helper()
	listOnce.Do(func() {
		cmd := exec.Command(repo.GoTool(t), "list", "-json=ImportPath,Dir,Imports", "./...")
		cmd.Dir = repo.Root(t)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			listErr = errors.New("go list: " + err.Error() + ": " + stderr.String())
			return
		}
		dec := json.NewDecoder(bytes.NewReader(out))
		for {
			var p pkg
			if err := dec.Decode(&p); err == io.EOF {
				break
			} else if err != nil {
				listErr = err
				return
			}
			listed = append(listed, p)
		}
	})
	if listErr != nil {
		t.Fatal(listErr)
	}
	if len(listed) < 20 {
		t.Fatalf("go list found %d packages: not the module's", len(listed))
	}
	return listed
}

// rule is one layering rule: a package that from selects may not import
// what forbidden says it may not.
type rule struct {
	name      string
	from      func(p string) bool
	forbidden func(from, imp string) bool
}

var rules = []rule{
	{
		name: "a utility under internal/ imports no domain package, binary wiring or test tool",
		from: func(p string) bool { return under(p, "internal") },
		forbidden: func(_, imp string) bool {
			return isDomain(imp) || under(imp, "cmd") || under(imp, "testkit") || under(imp, "systemtest")
		},
	},
	{
		name: "enforcement imports only limits and the standard library",
		from: func(p string) bool { return p == module+"/enforcement" },
		forbidden: func(_, imp string) bool {
			return !isStd(imp) && imp != module+"/limits"
		},
	},
	{
		name: "enforcement's subpackages import no metering, policylog or schema, and policy only in the Envoy adapter",
		from: func(p string) bool { return under(p, "enforcement") },
		forbidden: func(from, imp string) bool {
			if under(imp, "policy") {
				return !under(from, "enforcement/envoyrls")
			}
			return under(imp, "metering") || under(imp, "policylog") || under(imp, "schema")
		},
	},
	{
		name: "metering does not import enforcement",
		from: func(p string) bool { return under(p, "metering") },
		forbidden: func(_, imp string) bool {
			return under(imp, "enforcement")
		},
	},
	{
		name: "a domain package imports no binary's wiring and no test tool",
		from: isDomain,
		forbidden: func(_, imp string) bool {
			return under(imp, "cmd") || under(imp, "testkit") || under(imp, "systemtest")
		},
	},
	{
		name: "a product binary imports no test tool",
		from: func(p string) bool {
			return under(p, "cmd/limiter") || under(p, "cmd/meter-consumer") || under(p, "cmd/usage-api")
		},
		forbidden: func(_, imp string) bool {
			return under(imp, "testkit") || under(imp, "systemtest")
		},
	},
}

// TestLayers holds every package's own imports to the rules.
func TestLayers(t *testing.T) {
	pkgs := packages(t)
	for _, r := range rules {
		t.Run(r.name, func(t *testing.T) {
			checked := 0
			for _, p := range pkgs {
				if !r.from(p.ImportPath) {
					continue
				}
				checked++
				for _, imp := range p.Imports {
					if r.forbidden(p.ImportPath, imp) {
						t.Errorf("%s imports %s", rel(p.ImportPath), imp)
					}
				}
			}
			if checked == 0 {
				t.Fatal("the rule selects no package: its folder moved?")
			}
		})
	}
}

// layoutEntry is one line of the README's layout: the folders it names,
// what it says of them, and the line (for messages).
type layoutEntry struct {
	folders []string
	text    string
	line    string
}

// readmeLayout parses the code block of README.md's "## Code layout"
// section. An entry is a line that starts at the first column: folders,
// comma-separated (a name without "/" is a sibling of the first folder:
// "enforcement/httpapi, ginlimit"), then two spaces or more, then the
// description; indented lines continue the description.
func readmeLayout(t *testing.T) []layoutEntry {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repo.Root(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var out []layoutEntry
	section, block := false, false
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			section = line == "## Code layout"
			continue
		case !section:
			continue
		case strings.HasPrefix(line, "```") && block:
			section = false // the first block of the section is the layout
			continue
		case strings.HasPrefix(line, "```"):
			block = true
			continue
		case !block || strings.TrimSpace(line) == "":
			continue
		}
		if line[0] == ' ' {
			if len(out) == 0 {
				t.Fatalf("README layout: continuation line before any entry: %q", line)
			}
			out[len(out)-1].text += " " + strings.TrimSpace(line)
			continue
		}
		names, text, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("README layout: %q has no description (two spaces after the folders)", line)
		}
		e := layoutEntry{text: strings.TrimSpace(text), line: line}
		base := ""
		for i, n := range strings.Split(names, ",") {
			n = strings.TrimSuffix(strings.TrimSpace(n), "/")
			switch {
			case i == 0:
				base = filepath.ToSlash(filepath.Dir(n))
			case !strings.Contains(n, "/") && base != ".":
				n = base + "/" + n
			}
			e.folders = append(e.folders, n)
		}
		out = append(out, e)
	}
	if len(out) < 10 {
		t.Fatalf("README.md: %d entries in the \"Code layout\" code block; the section or its block moved?", len(out))
	}
	return out
}

// TestReadmeLayout checks the README's layout against the tree: every
// folder it names exists, every top-level folder (itself or a folder in
// it) and every folder of a layer (internal/, testkit/, systemtest/,
// cmd/, a binary's internal/) is named, and every import claim holds.
func TestReadmeLayout(t *testing.T) {
	root := repo.Root(t)
	entries := readmeLayout(t)
	named := map[string]bool{}
	for _, e := range entries {
		for _, f := range e.folders {
			named[f] = true
			if st, err := os.Stat(filepath.Join(root, filepath.FromSlash(f))); err != nil || !st.IsDir() {
				t.Errorf("README layout names %s, which is not a folder (line %q)", f, e.line)
			}
		}
	}
	want, err := layerFolders(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range want {
		inside := func(n string) bool { return strings.HasPrefix(n, f+"/") }
		if !named[f] && (strings.Contains(f, "/") || !slices.ContainsFunc(slices.Collect(maps.Keys(named)), inside)) {
			t.Errorf("README layout does not name %s", f)
		}
	}

	byDir := map[string]pkg{}
	for _, p := range packages(t) {
		byDir[rel(p.ImportPath)] = p
	}
	claims := 0
	for _, e := range entries {
		allowed, ok := importClaim(e.text)
		if !ok {
			continue
		}
		claims++
		p, found := byDir[e.folders[0]]
		if !found {
			t.Errorf("README layout claims the imports of %s, which is not a package", e.folders[0])
			continue
		}
		for _, imp := range p.Imports {
			if !claimAllows(allowed, imp) {
				t.Errorf("README layout says %s imports only %s; it imports %s", e.folders[0], strings.Join(allowed, ", "), imp)
			}
		}
	}
	if claims == 0 {
		t.Error("README layout makes no import claim: the \"(imports: ...)\" form changed?")
	}
}

// importClaim reads "(imports: standard library, limits)" from an entry's
// description: the standard library, folders of this module and
// third-party module paths.
func importClaim(text string) ([]string, bool) {
	_, after, ok := strings.Cut(text, "(imports: ")
	if !ok {
		return nil, false
	}
	list, _, ok := strings.Cut(after, ")")
	if !ok {
		return nil, false
	}
	var out []string
	for _, s := range strings.Split(list, ",") {
		out = append(out, strings.TrimSpace(s))
	}
	return out, true
}

func claimAllows(allowed []string, imp string) bool {
	for _, a := range allowed {
		switch {
		case a == "standard library":
			if isStd(imp) {
				return true
			}
		case strings.Contains(strings.SplitN(a, "/", 2)[0], "."): // a module path
			if imp == a || strings.HasPrefix(imp, a+"/") {
				return true
			}
		default:
			if ours(imp) && rel(imp) == a {
				return true
			}
		}
	}
	return false
}

// layerFolders are the folders the layout must name: each top-level
// folder (but hidden ones and those .gitignore keeps out: bin/, run/ ...),
// and each folder of internal/, testkit/, systemtest/, cmd/ and
// cmd/<binary>/internal/.
func layerFolders(root string) ([]string, error) {
	ignored := map[string]bool{}
	if raw, err := os.ReadFile(filepath.Join(root, ".gitignore")); err == nil {
		for _, l := range strings.Split(string(raw), "\n") {
			if n, ok := strings.CutPrefix(strings.TrimSpace(l), "/"); ok && strings.Count(n, "/") == 1 && strings.HasSuffix(n, "/") {
				ignored[strings.TrimSuffix(n, "/")] = true
			}
		}
	}
	var out []string
	add := func(dir string) error {
		ents, err := os.ReadDir(filepath.Join(root, filepath.FromSlash(dir)))
		if err != nil {
			if dir != "" && errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		for _, e := range ents {
			if !e.IsDir() || strings.HasPrefix(e.Name(), ".") || (dir == "" && ignored[e.Name()]) {
				continue
			}
			out = append(out, strings.TrimPrefix(dir+"/"+e.Name(), "/"))
		}
		return nil
	}
	for _, d := range []string{"", "internal", "testkit", "systemtest", "cmd"} {
		if err := add(d); err != nil {
			return nil, err
		}
	}
	bins, err := os.ReadDir(filepath.Join(root, "cmd"))
	if err != nil {
		return nil, err
	}
	for _, b := range bins {
		if b.IsDir() {
			if err := add("cmd/" + b.Name() + "/internal"); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}
