package archtest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// repoRoot is the module root, two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// markdownFiles lists the repository's Markdown files.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

var (
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// A path in backquotes that climbs out of its directory or is
	// absolute, e.g. `../shared/DESIGN.md` or `/work/x`.
	outsidePath = regexp.MustCompile("`(\\.\\./[^`]*|/(?:work|home|tmp)/[^`]*)`")
)

// The docs point only at files inside the repository, and those exist: a
// reader of a clone has nothing else.
func TestDocsLinkInsideTheRepository(t *testing.T) {
	root := repoRoot(t)
	for _, file := range markdownFiles(t, root) {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, file)
		for _, m := range mdLink.FindAllStringSubmatch(string(text), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			target, _, _ = strings.Cut(target, "#")
			abs := filepath.Clean(filepath.Join(filepath.Dir(file), target))
			if inRepo, _ := filepath.Rel(root, abs); strings.HasPrefix(inRepo, "..") || filepath.IsAbs(target) {
				t.Errorf("%s links outside the repository: %s", rel, m[1])
			} else if _, err := os.Stat(abs); err != nil {
				t.Errorf("%s links to a missing file: %s", rel, m[1])
			}
		}
		for _, m := range outsidePath.FindAllStringSubmatch(string(text), -1) {
			t.Errorf("%s names a path outside the repository: %s", rel, m[1])
		}
	}
}

// docs/benchmarks.md lists exactly what `make bench` runs.
func TestMakeBenchIsDocumented(t *testing.T) {
	root := repoRoot(t)
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "benchmarks.md"))
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^(\w+)\s*\??:?=\s*(.*)$`).FindAllStringSubmatch(string(mk), -1) {
		vars[m[1]] = strings.TrimSpace(m[2])
	}
	_, recipe, ok := strings.Cut(string(mk), "\nbench:\n")
	if !ok {
		t.Fatal("the Makefile has no bench target")
	}
	expand := regexp.MustCompile(`\$\((\w+)\)`)
	var n int
	for line := range strings.Lines(recipe) {
		if !strings.HasPrefix(line, "\t") {
			break
		}
		cmd := strings.TrimSpace(line)
		for expand.MatchString(cmd) {
			cmd = expand.ReplaceAllStringFunc(cmd, func(v string) string { return vars[v[2:len(v)-1]] })
		}
		cmd = strings.ReplaceAll(strings.ReplaceAll(cmd, "$$", "$"), "-modfile=tools/go.mod ", "")
		n++
		if !strings.Contains(string(doc), "\n"+cmd+"\n") {
			t.Errorf("docs/benchmarks.md does not list `make bench`'s line:\n%s", cmd)
		}
	}
	if n == 0 {
		t.Fatal("the bench target runs nothing")
	}
}
