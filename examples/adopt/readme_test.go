package main

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// marker ends every line adopting pglimit added or changed.
var marker = regexp.MustCompile(`//\s*pglimit:(\S*)\s*$`)

// parts are the parts of the adoption, as the README's table names them.
var parts = []string{"setup", "signin", "heavy", "inflight"}

// adoptionLines counts the marked lines of the example's own source (not
// its tests) per part; a marker naming another part fails t.
func adoptionLines(t *testing.T) map[string]int {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			m := marker.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			if !slices.Contains(parts, m[1]) {
				t.Errorf("%s:%d: marker pglimit:%s names no part (%v)", f, i+1, m[1], parts)
			}
			counts[m[1]]++
		}
	}
	return counts
}

// readmeTable reads the lines column of the README's table in "Adopting
// pglimit in your service": part -> lines.
func readmeTable(t *testing.T) map[string]int {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Adopting pglimit in your service\n")
	if !ok {
		t.Fatal(`README.md has no section "## Adopting pglimit in your service"`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	row := regexp.MustCompile(`(?m)^\| (\w+) \| (\d+) \|`)
	table := map[string]int{}
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		n, _ := strconv.Atoi(m[2])
		table[m[1]] = n
	}
	return table
}

// TestReadmeAdoptionLines keeps the README's count of the adoption lines
// true: per part and in total, as the example's markers count them.
func TestReadmeAdoptionLines(t *testing.T) {
	t.Parallel()
	counts, table := adoptionLines(t), readmeTable(t)
	total := 0
	for _, p := range parts {
		if counts[p] == 0 {
			t.Errorf("the example marks no line of part %s", p)
		}
		if table[p] != counts[p] {
			t.Errorf("README: %s takes %d lines; the example marks %d", p, table[p], counts[p])
		}
		total += counts[p]
	}
	if table["total"] != total {
		t.Errorf("README: %d lines in total; the example marks %d", table["total"], total)
	}
	if len(table) != len(parts)+1 {
		t.Errorf("README's adoption table has rows %v, want %v and total", table, parts)
	}
	t.Logf("adoption lines: %v, %d in total", counts, total)
}

// TestOnlyThePublicAPI keeps the example to what any service can import:
// the root package and the three middlewares it adopts, nothing internal,
// generated or lower-level.
func TestOnlyThePublicAPI(t *testing.T) {
	t.Parallel()
	allowed := []string{
		"github.com/pglimit/pglimit",
		"github.com/pglimit/pglimit/middleware/heavy",
		"github.com/pglimit/pglimit/middleware/inflight",
		"github.com/pglimit/pglimit/middleware/signin",
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		parsed, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range parsed.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if path != allowed[0] && !strings.HasPrefix(path, allowed[0]+"/") {
				continue
			}
			if !slices.Contains(allowed, path) {
				t.Errorf("%s imports %s: the example adopts pglimit through %v only", f, path, allowed)
			}
			used[path] = true
		}
	}
	for _, p := range allowed {
		if !used[p] {
			t.Errorf("the example does not import %s", p)
		}
	}
}
