// Package doccheck finds documentation links that no longer resolve: doc
// links in Go comments that name no declared identifier, and relative
// links in Markdown files whose file or heading does not exist.
//
// A doc link is what go doc would link if the name existed (go doc shows
// a link it cannot resolve as plain text, so a rename silently turns links
// into bracketed words). Each of these must resolve, where T is a type, M
// its method or field, and pkg a package that the file's package imports
// (or a one-element standard-library path, as go doc allows):
//
//	[T]  [T.M]  [pkg]  [pkg.T]  [pkg.T.M]  [*pkg.T]  [example.com/full/path.T]
//
// They resolve in the workspace's own packages, the standard library, and
// the module cache for other required modules (a module missing from the
// cache is counted in [Stats.External] and not checked). Brackets around
// lower-case words ([j], [lo, hi], a TOML [table]) are prose to go doc
// and are not checked, and neither are references to unexported names,
// which go doc never links.
//
// A Markdown link is checked when its target has no scheme:
//
//	[text](docs/x.md#anchor)  ![alt](img.png)  [label]: ../y.md
//
// The file must exist in the repository; an anchor into a Markdown file
// must be one of its headings' GitHub slugs ([Slug]) or an <a> id or name.
// Links in fenced or indented code and in code spans are skipped.
//
// Three more checks keep Markdown prose true: [Checker.CheckTestNames]
// (a test named in a code span exists), [Checker.CheckPaths] (a
// repository path in a code span exists) and [Checker.CheckTerms]
// (wording the code no longer supports).
//
// It uses only the standard library (go/parser, go/doc/comment, go/build).
// A test in this package runs it over the whole repository, so a rename
// that leaves a link behind fails `go test`.
package doccheck

import (
	"fmt"
	"go/ast"
	"go/build"
	"go/doc/comment"
	"go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// A Problem is one link that does not resolve.
type Problem struct {
	File string // path relative to the root, with forward slashes
	Line int
	Link string // the link as written, with its brackets
	Why  string
}

func (p Problem) String() string {
	return fmt.Sprintf("%s:%d: %s: %s", p.File, p.Line, p.Link, p.Why)
}

// Key is the problem's allowlist key: "file: link", without the line, so
// that it survives edits elsewhere in the file.
func (p Problem) Key() string { return p.File + ": " + p.Link }

// Stats counts what a check looked at.
type Stats struct {
	Packages, GoFiles, DocLinks int
	// External counts doc links into packages outside the workspace's
	// modules and the standard library that could not be read (their
	// module is not in the module cache); they are not checked.
	External int

	MarkdownFiles, MarkdownLinks int
}

// module is one Go module of the workspace.
type module struct {
	path string // module path
	dir  string // absolute directory
}

// Checker resolves doc links for the modules of one workspace.
type Checker struct {
	root    string
	modules []module
	require map[string]string // module path -> version, from the go.mod files
	fset    *token.FileSet
	syms    map[string]map[string]bool // import path -> symbols (nil: not found)
	names   map[string]string          // import path -> package name
	Stats   Stats
}

// NewChecker returns a checker for the workspace rooted at root: the
// modules that root's go.work uses, or root's go.mod alone.
func NewChecker(root string) (*Checker, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	c := &Checker{root: root, require: map[string]string{}, fset: token.NewFileSet(), syms: map[string]map[string]bool{}, names: map[string]string{}}
	dirs := []string{"."}
	if work, err := os.ReadFile(filepath.Join(root, "go.work")); err == nil {
		dirs = workUses(work)
	}
	for _, d := range dirs {
		dir := filepath.Join(root, filepath.FromSlash(d))
		mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err != nil {
			return nil, err
		}
		mp, req := parseGoMod(mod)
		if mp == "" {
			return nil, fmt.Errorf("%s: no module line", filepath.Join(d, "go.mod"))
		}
		c.modules = append(c.modules, module{path: mp, dir: dir})
		for k, v := range req {
			c.require[k] = v
		}
	}
	return c, nil
}

// workUses returns the directories of a go.work file's use directives.
func workUses(work []byte) []string {
	var dirs []string
	inUse := false
	for _, line := range strings.Split(string(work), "\n") {
		line = strings.TrimSpace(line)
		if i := strings.Index(line, "//"); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		switch {
		case inUse && line == ")":
			inUse = false
		case inUse && line != "":
			dirs = append(dirs, line)
		case line == "use (":
			inUse = true
		case strings.HasPrefix(line, "use "):
			dirs = append(dirs, strings.TrimSpace(strings.TrimPrefix(line, "use ")))
		}
	}
	return dirs
}

// parseGoMod returns a go.mod file's module path and its requirements.
func parseGoMod(mod []byte) (string, map[string]string) {
	var mp string
	req := map[string]string{}
	inReq := false
	for _, line := range strings.Split(string(mod), "\n") {
		if i := strings.Index(line, "//"); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		switch {
		case len(f) == 0:
		case f[0] == "module" && len(f) == 2:
			mp = strings.Trim(f[1], `"`)
		case f[0] == "require" && len(f) == 2 && f[1] == "(":
			inReq = true
		case inReq && f[0] == ")":
			inReq = false
		case inReq && len(f) >= 2:
			req[f[0]] = f[1]
		case f[0] == "require" && len(f) >= 3:
			req[f[1]] = f[2]
		}
	}
	return mp, req
}

// CheckGo checks every doc link in the Go files of the workspace's
// modules (testdata directories and nested modules outside the workspace
// are skipped), and returns the problems sorted by file and line.
func (c *Checker) CheckGo() ([]Problem, error) {
	var probs []Problem
	for _, m := range c.modules {
		err := filepath.WalkDir(m.dir, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() {
				return nil
			}
			name := d.Name()
			if p != m.dir && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			if p != m.dir {
				if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
					return filepath.SkipDir // another module: checked on its own, or not at all
				}
			}
			rel, _ := filepath.Rel(m.dir, p)
			ip := m.path
			if rel != "." {
				ip += "/" + filepath.ToSlash(rel)
			}
			ps, err := c.checkDir(p, ip)
			probs = append(probs, ps...)
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	sortProblems(probs)
	return probs, nil
}

// pkgFiles is one package's files in a directory.
type pkgFiles struct {
	name        string
	files       []*ast.File
	isTest      []bool
	importsByNm map[string]string // package name -> import path ("" when ambiguous)
}

// checkDir checks the Go files of one directory, whose import path is ip.
func (c *Checker) checkDir(dir, ip string) ([]Problem, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	pkgs := map[string]*pkgFiles{}
	var order []string
	for _, e := range ents {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") {
			continue
		}
		f, err := parser.ParseFile(c.fset, filepath.Join(dir, e.Name()), nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		c.Stats.GoFiles++
		pn := f.Name.Name
		pf := pkgs[pn]
		if pf == nil {
			pf = &pkgFiles{name: pn, importsByNm: map[string]string{}}
			pkgs[pn] = pf
			order = append(order, pn)
		}
		pf.files = append(pf.files, f)
		pf.isTest = append(pf.isTest, strings.HasSuffix(e.Name(), "_test.go"))
		for _, is := range f.Imports {
			p := strings.Trim(is.Path.Value, `"`)
			n := c.importName(p)
			if is.Name != nil {
				n = is.Name.Name
			}
			if n == "_" || n == "." {
				continue
			}
			if old, ok := pf.importsByNm[n]; ok && old != p {
				pf.importsByNm[n] = ""
			} else {
				pf.importsByNm[n] = p
			}
		}
	}
	var probs []Problem
	for _, pn := range order {
		pf := pkgs[pn]
		c.Stats.Packages++
		// The package's own API: its non-test files. Test files also see
		// the symbols of their own test files.
		var api, all []*ast.File
		for i, f := range pf.files {
			if !pf.isTest[i] {
				api = append(api, f)
			}
			all = append(all, f)
		}
		apiSyms, allSyms := collectSyms(api), collectSyms(all)
		if !strings.HasSuffix(pn, "_test") {
			c.syms[ip] = apiSyms
		}
		for i, f := range pf.files {
			syms := apiSyms
			if pf.isTest[i] {
				syms = allSyms
			}
			probs = append(probs, c.checkFile(f, pf, syms)...)
		}
	}
	return probs, nil
}

// importName is the package name an import path brings into scope when
// imported without a name: the package clause of the package, wherever
// it can be read (the workspace, the standard library, the module cache),
// else the path's last element without a major-version suffix or a
// "go-" prefix, as go/doc assumes.
func (c *Checker) importName(ip string) string {
	if n, ok := c.names[ip]; ok {
		return n
	}
	n := c.guessName(ip)
	c.names[ip] = n
	return n
}

func (c *Checker) guessName(ip string) string {
	if dir, ok := c.packageDir(ip); ok {
		if n := packageName(dir); n != "" {
			return n
		}
	}
	base := path.Base(ip)
	if len(base) >= 2 && base[0] == 'v' && strings.Trim(base[1:], "0123456789") == "" {
		base = path.Base(path.Dir(ip))
	}
	return strings.TrimPrefix(base, "go-")
}

// packageDir returns the directory of the package at import path ip.
func (c *Checker) packageDir(ip string) (string, bool) {
	if dir, ok := c.localDir(ip); ok {
		return dir, true
	}
	if isStd(ip) {
		if bp, err := build.Default.Import(ip, "", build.FindOnly); err == nil && bp.Goroot {
			return bp.Dir, true
		}
		return "", false
	}
	return c.moduleCacheDir(ip)
}

// packageName returns the package clause of the first non-test Go file in dir.
func packageName(dir string) string {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".go") && !strings.HasSuffix(e.Name(), "_test.go") {
			f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, e.Name()), nil, parser.PackageClauseOnly)
			if err == nil {
				return f.Name.Name
			}
		}
	}
	return ""
}

// collectSyms returns the names a doc link may refer to, as go/doc counts
// them: top-level consts, vars, types and funcs, and "T.M" for each method
// M of T and each field or interface method M of a struct or interface T.
func collectSyms(files []*ast.File) map[string]bool {
	syms := map[string]bool{}
	for _, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil || len(d.Recv.List) == 0 {
					syms[d.Name.Name] = true
					continue
				}
				if r := recvName(d.Recv.List[0].Type); r != "" {
					syms[r+"."+d.Name.Name] = true
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.ValueSpec:
						for _, n := range s.Names {
							syms[n.Name] = true
						}
					case *ast.TypeSpec:
						syms[s.Name.Name] = true
						var fl *ast.FieldList
						switch t := s.Type.(type) {
						case *ast.StructType:
							fl = t.Fields
						case *ast.InterfaceType:
							fl = t.Methods
						}
						if fl == nil {
							continue
						}
						for _, fd := range fl.List {
							for _, n := range fd.Names {
								syms[s.Name.Name+"."+n.Name] = true
							}
							if len(fd.Names) == 0 { // embedded: its name is a field
								if n := recvName(fd.Type); n != "" {
									syms[s.Name.Name+"."+n] = true
								}
							}
						}
					}
				}
			}
		}
	}
	return syms
}

// recvName returns the type name of a receiver or embedded field type.
func recvName(e ast.Expr) string {
	for {
		switch t := e.(type) {
		case *ast.StarExpr:
			e = t.X
		case *ast.IndexExpr:
			e = t.X
		case *ast.IndexListExpr:
			e = t.X
		case *ast.ParenExpr:
			e = t.X
		case *ast.SelectorExpr:
			return t.Sel.Name
		case *ast.Ident:
			return t.Name
		default:
			return ""
		}
	}
}

// A candidate is bracketed text in a comment line that may be a doc link.
type candidate struct {
	line int
	text string // between the brackets
}

// linkRE matches bracketed text shaped like a doc link: an optional star,
// then identifiers or an import path joined by dots.
var linkRE = regexp.MustCompile(`\[\*?[\p{L}_][\p{L}\p{N}_./-]*\]`)

// checkFile checks the doc links of every comment in f.
func (c *Checker) checkFile(f *ast.File, pf *pkgFiles, syms map[string]bool) []Problem {
	var probs []Problem
	fname := c.rel(c.fset.Position(f.Package).Filename)
	lookupPkg := func(name string) (string, bool) {
		if p, ok := pf.importsByNm[name]; ok {
			return p, p != ""
		}
		if name == pf.name {
			return "", true // the package itself, as go/doc allows
		}
		return "", false
	}
	for _, cg := range f.Comments {
		// What the doc parser sees as links, with every name accepted, so
		// that a link to a missing name is not silently dropped to text.
		var p comment.Parser
		p.LookupSym = func(recv, name string) bool { return true }
		p.LookupPackage = func(name string) (string, bool) {
			if ip, ok := lookupPkg(name); ok {
				return ip, true
			}
			if ip, ok := comment.DefaultLookupPackage(name); ok {
				return ip, true
			}
			// Keep the name as written, so that an unknown package is
			// reported rather than dropped.
			return "?" + name, true
		}
		links := docLinks(p.Parse(cg.Text()))
		if len(links) == 0 {
			continue
		}
		cands := commentCandidates(c.fset, cg)
		ci := 0
		for _, l := range links {
			c.Stats.DocLinks++
			line := c.fset.Position(cg.Pos()).Line
			written := linkText(l)
			for j := ci; j < len(cands); j++ {
				if sameLink(cands[j].text, l, lookupPkg) {
					line, written, ci = cands[j].line, "["+cands[j].text+"]", j+1
					break
				}
			}
			if why := c.resolve(l, syms); why != "" {
				probs = append(probs, Problem{File: fname, Line: line, Link: written, Why: why})
			}
		}
	}
	return probs
}

// commentCandidates returns the bracketed texts of a comment group's lines,
// in order, with the rules of the doc parser: the character before the
// opening bracket and after the closing one is a space, punctuation, or
// the line's end.
func commentCandidates(fset *token.FileSet, cg *ast.CommentGroup) []candidate {
	var out []candidate
	for _, cm := range cg.List {
		line := fset.Position(cm.Pos()).Line
		for i, s := range strings.Split(cm.Text, "\n") {
			for _, loc := range linkRE.FindAllStringIndex(s, -1) {
				if loc[0] > 0 {
					r, _ := utf8.DecodeLastRuneInString(s[:loc[0]])
					if !unicode.IsPunct(r) && !unicode.IsSpace(r) {
						continue
					}
				}
				if loc[1] < len(s) {
					r, _ := utf8.DecodeRuneInString(s[loc[1]:])
					if !unicode.IsPunct(r) && !unicode.IsSpace(r) {
						continue
					}
				}
				out = append(out, candidate{line: line + i, text: s[loc[0]+1 : loc[1]-1]})
			}
		}
	}
	return out
}

// sameLink reports whether the bracketed text parses to link l, splitting
// it as the doc parser does.
func sameLink(text string, l *comment.DocLink, lookupPkg func(string) (string, bool)) bool {
	text = strings.TrimPrefix(text, "*")
	pkg, name, ok := splitDocName(text)
	var recv string
	if ok {
		pkg, recv, _ = splitDocName(pkg)
	}
	if name != l.Name || recv != l.Recv {
		return false
	}
	switch {
	case pkg == "":
		return l.ImportPath == ""
	case strings.Contains(pkg, "/"):
		return pkg == l.ImportPath
	default:
		ip, ok := lookupPkg(pkg)
		if !ok {
			if ip, ok = comment.DefaultLookupPackage(pkg); !ok {
				ip = "?" + pkg
			}
		}
		return ip == l.ImportPath
	}
}

// splitDocName is go/doc/comment's: if text is before.Name, with Name a
// capitalised identifier, it returns before, Name, true.
func splitDocName(text string) (before, name string, foundDot bool) {
	i := strings.LastIndex(text, ".")
	name = text[i+1:]
	if !isName(name) {
		return text, "", false
	}
	if i >= 0 {
		before = text[:i]
	}
	return before, name, true
}

// isIdent reports whether s is a Go identifier.
func isIdent(s string) bool {
	for i, r := range s {
		if !(unicode.IsLetter(r) || r == '_' || i > 0 && unicode.IsDigit(r)) {
			return false
		}
	}
	return s != ""
}

// isName reports whether s is a capitalised Go identifier.
func isName(s string) bool {
	for i, r := range s {
		if !(unicode.IsLetter(r) || r == '_' || i > 0 && unicode.IsDigit(r)) {
			return false
		}
	}
	r, _ := utf8.DecodeRuneInString(s)
	return unicode.IsUpper(r)
}

// linkText writes a doc link back as text.
func linkText(l *comment.DocLink) string {
	var b strings.Builder
	b.WriteString("[")
	if l.ImportPath != "" {
		b.WriteString(strings.TrimPrefix(l.ImportPath, "?"))
		if l.Name != "" {
			b.WriteString(".")
		}
	}
	if l.Recv != "" {
		b.WriteString(l.Recv + ".")
	}
	b.WriteString(l.Name + "]")
	return b.String()
}

// docLinks returns the doc links of a parsed comment, in order.
func docLinks(d *comment.Doc) []*comment.DocLink {
	var out []*comment.DocLink
	var text func([]comment.Text)
	text = func(ts []comment.Text) {
		for _, t := range ts {
			switch t := t.(type) {
			case *comment.DocLink:
				out = append(out, t)
			case *comment.Italic, comment.Plain:
			case *comment.Link:
				text(t.Text)
			}
		}
	}
	var blocks func([]comment.Block)
	blocks = func(bs []comment.Block) {
		for _, b := range bs {
			switch b := b.(type) {
			case *comment.Paragraph:
				text(b.Text)
			case *comment.List:
				for _, it := range b.Items {
					blocks(it.Content)
				}
			}
		}
	}
	blocks(d.Content)
	return out
}

// resolve returns why a doc link does not resolve, or "".
func (c *Checker) resolve(l *comment.DocLink, local map[string]bool) string {
	if strings.HasPrefix(l.ImportPath, "?") {
		// go doc shows an unknown package's link as plain text. Bracketed
		// prose (an index, a range, a TOML table) is that too; a link to a
		// capitalised name in an unknown package lost its package.
		if l.Name == "" || !isIdent(l.ImportPath[1:]) {
			return ""
		}
		return fmt.Sprintf("package %s is not imported here, so the link does not resolve (import it, or write its import path)", l.ImportPath[1:])
	}
	if l.ImportPath == "" && l.Name == "" {
		return "" // [p] in package p
	}
	syms := local
	where := "this package"
	if l.ImportPath != "" {
		s, ok := c.packageSyms(l.ImportPath)
		if !ok {
			if c.isLocal(l.ImportPath) || isStd(l.ImportPath) {
				return fmt.Sprintf("no package %s", l.ImportPath)
			}
			c.Stats.External++
			return ""
		}
		if l.Name == "" {
			return ""
		}
		syms, where = s, "package "+l.ImportPath
	}
	if l.Recv != "" {
		if syms[l.Recv+"."+l.Name] {
			return ""
		}
		if !syms[l.Recv] {
			return fmt.Sprintf("%s declares no %s", where, l.Recv)
		}
		return fmt.Sprintf("type %s of %s has no method or field %s", l.Recv, where, l.Name)
	}
	if syms[l.Name] {
		return ""
	}
	return fmt.Sprintf("%s declares no %s", where, l.Name)
}

// isStd reports whether ip looks like a standard-library import path: its
// first element has no dot.
func isStd(ip string) bool {
	first, _, _ := strings.Cut(ip, "/")
	return !strings.Contains(first, ".")
}

// localDir returns the directory of a workspace package's import path.
func (c *Checker) localDir(ip string) (string, bool) {
	best := -1
	for i, m := range c.modules {
		if ip == m.path || strings.HasPrefix(ip, m.path+"/") {
			if best < 0 || len(m.path) > len(c.modules[best].path) {
				best = i
			}
		}
	}
	if best < 0 {
		return "", false
	}
	m := c.modules[best]
	return filepath.Join(m.dir, filepath.FromSlash(strings.TrimPrefix(strings.TrimPrefix(ip, m.path), "/"))), true
}

func (c *Checker) isLocal(ip string) bool {
	_, ok := c.localDir(ip)
	return ok
}

// packageSyms returns the symbols of the package at import path ip: a
// workspace package, a standard-library package, or a package of a
// required module found in the module cache.
func (c *Checker) packageSyms(ip string) (map[string]bool, bool) {
	if s, ok := c.syms[ip]; ok {
		return s, s != nil
	}
	dir, ok := c.packageDir(ip)
	var syms map[string]bool
	if ok {
		syms = parseAPI(dir)
	}
	c.syms[ip] = syms
	return syms, syms != nil
}

// moduleCacheDir returns the module-cache directory of a package of a
// module that a workspace go.mod requires.
func (c *Checker) moduleCacheDir(ip string) (string, bool) {
	var mp string
	for r := range c.require {
		if (ip == r || strings.HasPrefix(ip, r+"/")) && len(r) > len(mp) {
			mp = r
		}
	}
	if mp == "" {
		return "", false
	}
	cache := os.Getenv("GOMODCACHE")
	if cache == "" {
		gp := build.Default.GOPATH
		if i := strings.IndexByte(gp, filepath.ListSeparator); i >= 0 {
			gp = gp[:i]
		}
		cache = filepath.Join(gp, "pkg", "mod")
	}
	dir := filepath.Join(cache, filepath.FromSlash(escapePath(mp)+"@"+c.require[mp]), filepath.FromSlash(strings.TrimPrefix(strings.TrimPrefix(ip, mp), "/")))
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return "", false
	}
	return dir, true
}

// escapePath escapes a module path as the module cache does: each upper
// case letter becomes '!' and its lower case.
func escapePath(p string) string {
	var b strings.Builder
	for _, r := range p {
		if unicode.IsUpper(r) {
			b.WriteByte('!')
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// parseAPI returns the symbols of the non-test Go files in dir, or nil
// when it has none.
func parseAPI(dir string) map[string]bool {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.SkipObjectResolution)
		if err != nil {
			continue
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		return nil
	}
	return collectSyms(files)
}

func (c *Checker) rel(p string) string {
	if r, err := filepath.Rel(c.root, p); err == nil {
		return filepath.ToSlash(r)
	}
	return filepath.ToSlash(p)
}

func sortProblems(ps []Problem) {
	sort.SliceStable(ps, func(i, j int) bool {
		if ps[i].File != ps[j].File {
			return ps[i].File < ps[j].File
		}
		return ps[i].Line < ps[j].Line
	})
}

// CheckMarkdown checks the relative links of every Markdown file under the
// root (hidden directories and directories with a go.work of their own
// skipped): the file or directory a link names
// must exist, and an anchor into a Markdown file must name one of its
// headings (GitHub's slugs) or an explicit id or name attribute.
func (c *Checker) CheckMarkdown() ([]Problem, error) {
	var probs []Problem
	anchors := map[string]map[string]bool{}
	err := c.walkMarkdown(func(p string, src []byte) {
		c.Stats.MarkdownFiles++
		for _, l := range markdownLinks(src) {
			c.Stats.MarkdownLinks++
			if why := c.resolveMarkdown(p, l.target, anchors); why != "" {
				probs = append(probs, Problem{File: c.rel(p), Line: l.line, Link: l.raw, Why: why})
			}
		}
	})
	sortProblems(probs)
	return probs, err
}

type mdLink struct {
	line        int
	raw, target string
}

var (
	// inlineLinkRE matches an inline link or image, with a target and an
	// optional title; its text may hold one level of nested brackets.
	inlineLinkRE = regexp.MustCompile(`!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(([^()\s]*(?:\([^()\s]*\)[^()\s]*)*)(?:\s+"[^"]*")?\)`)
	// refDefRE matches a reference definition, a label and its target.
	refDefRE   = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*(\S+)`)
	codeSpanRE = regexp.MustCompile("`+[^`]*`+")
	schemeRE   = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
)

// markdownLinks returns the links of a Markdown file outside code: fenced
// blocks, indented blocks after a blank line, and code spans are skipped.
func markdownLinks(src []byte) []mdLink {
	var out []mdLink
	forEachProse(src, func(n int, line string) {
		clean := codeSpanRE.ReplaceAllStringFunc(line, func(s string) string { return strings.Repeat(" ", len(s)) })
		for _, m := range inlineLinkRE.FindAllStringSubmatch(clean, -1) {
			out = append(out, mdLink{line: n, raw: m[0], target: strings.Trim(m[2], "<>")})
		}
		if m := refDefRE.FindStringSubmatch(clean); m != nil {
			out = append(out, mdLink{line: n, raw: strings.TrimSpace(m[0]), target: strings.Trim(m[1], "<>")})
		}
	})
	return out
}

// resolveMarkdown returns why a link target in Markdown file from does not
// resolve, or "". Links with a scheme (https:, mailto:) are not checked.
func (c *Checker) resolveMarkdown(from, target string, anchors map[string]map[string]bool) string {
	if target == "" || schemeRE.MatchString(target) || strings.HasPrefix(target, "//") {
		return ""
	}
	file, anchor, _ := strings.Cut(target, "#")
	if i := strings.IndexByte(file, '?'); i >= 0 {
		file = file[:i]
	}
	dest := from
	if file != "" {
		if strings.HasPrefix(file, "/") {
			dest = filepath.Join(c.root, filepath.FromSlash(file))
		} else {
			dest = filepath.Join(filepath.Dir(from), filepath.FromSlash(file))
		}
		if r, err := filepath.Rel(c.root, dest); err != nil || strings.HasPrefix(r, "..") {
			return "leaves the repository"
		}
		if _, err := os.Stat(dest); err != nil {
			return fmt.Sprintf("%s does not exist", c.rel(dest))
		}
	}
	if anchor == "" || !strings.EqualFold(filepath.Ext(dest), ".md") {
		return ""
	}
	a, ok := anchors[dest]
	if !ok {
		src, err := os.ReadFile(dest)
		if err != nil {
			return err.Error()
		}
		a = Anchors(src)
		anchors[dest] = a
	}
	if !a[strings.ToLower(anchor)] {
		return fmt.Sprintf("%s has no heading with anchor #%s", c.rel(dest), anchor)
	}
	return ""
}

var (
	headingRE = regexp.MustCompile(`^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	idAttrRE  = regexp.MustCompile(`(?i)<a\s+[^>]*(?:name|id)\s*=\s*"([^"]+)"`)
	mdLinkRE  = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlTagRE = regexp.MustCompile(`<[^>]+>`)
)

// Anchors returns the anchors of a Markdown file: the slug of each ATX
// heading outside fenced code, as GitHub makes them (duplicates get -1,
// -2, ...), and the ids and names of <a> tags.
func Anchors(src []byte) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fence := ""
	for _, line := range strings.Split(string(src), "\n") {
		trimmed := strings.TrimLeft(line, " ")
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		for _, m := range idAttrRE.FindAllStringSubmatch(line, -1) {
			out[strings.ToLower(m[1])] = true
		}
		m := headingRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s := Slug(m[2])
		if k := seen[s]; k > 0 {
			out[fmt.Sprintf("%s-%d", s, k)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// Slug returns GitHub's anchor for a heading's text: the rendered text
// (link targets, tags and emphasis marks dropped) in lower case, with
// every character that is not a letter, digit, space, '-' or '_' removed
// and each space turned into '-'.
func Slug(heading string) string {
	heading = mdLinkRE.ReplaceAllString(heading, "$1")
	heading = htmlTagRE.ReplaceAllString(heading, "")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// testNameRE matches a code span that names a test function, with an
// optional subtest path or a trailing "..." (a family of tests).
var testNameRE = regexp.MustCompile("`((?:Test|Fuzz|Benchmark|Example)[A-Za-z0-9_]*)(?:/[^`]*|\\.\\.\\.)?`")

// CheckTestNames checks that every test a Markdown file names in a code
// span (`TestX`, `TestX/sub`, `FuzzY`, `BenchmarkZ`, `ExampleW`) is a
// function of some _test.go file under the root, in any module. A name
// ending in "..." must be the prefix of one. Code blocks are skipped.
func (c *Checker) CheckTestNames() ([]Problem, error) {
	names := map[string]bool{}
	err := filepath.WalkDir(c.root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != c.root && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil // a fixture that does not parse names no test
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil {
				names[fd.Name.Name] = true
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var probs []Problem
	err = c.walkMarkdown(func(p string, src []byte) {
		forEachProse(src, func(n int, line string) {
			for _, m := range testNameRE.FindAllStringSubmatch(line, -1) {
				name := m[1]
				if strings.HasSuffix(m[0], "...`") {
					found := false
					for k := range names {
						if strings.HasPrefix(k, name) {
							found = true
							break
						}
					}
					if !found {
						probs = append(probs, Problem{File: c.rel(p), Line: n, Link: m[0], Why: "no test function starts with " + name})
					}
					continue
				}
				if !names[name] {
					probs = append(probs, Problem{File: c.rel(p), Line: n, Link: m[0], Why: "no test function " + name})
				}
			}
		})
	})
	sortProblems(probs)
	return probs, err
}

// pathSpanRE matches a code span that holds a relative path of two or
// more elements.
var pathSpanRE = regexp.MustCompile("`([A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)+/?)`")

// CheckPaths checks that every repository path a Markdown file names in a
// code span (`host/owner.go`, `stages/internal/wasmbin`) exists, relative
// to the root or to the file. Only paths whose first element is a
// top-level file or directory of the repository are checked, so paths of
// other trees (a generated project's `hello/main.go`) are left alone.
// Code blocks are skipped.
func (c *Checker) CheckPaths() ([]Problem, error) {
	top := map[string]bool{}
	ents, err := os.ReadDir(c.root)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			top[e.Name()] = true
		}
	}
	var probs []Problem
	err = c.walkMarkdown(func(p string, src []byte) {
		forEachProse(src, func(n int, line string) {
			for _, m := range pathSpanRE.FindAllStringSubmatch(line, -1) {
				rel := strings.TrimSuffix(m[1], "/")
				first, _, _ := strings.Cut(rel, "/")
				if !top[first] {
					continue
				}
				if _, err := os.Stat(filepath.Join(c.root, filepath.FromSlash(rel))); err == nil {
					continue
				}
				if _, err := os.Stat(filepath.Join(filepath.Dir(p), filepath.FromSlash(rel))); err == nil {
					continue
				}
				probs = append(probs, Problem{File: c.rel(p), Line: n, Link: m[0], Why: rel + " does not exist"})
			}
		})
	})
	sortProblems(probs)
	return probs, err
}

// A Term is wording that no longer describes the code, and what replaced
// it.
type Term struct {
	RE   *regexp.Regexp
	Why  string
	Skip []string // directories (relative, with slashes) not searched
}

// CheckTerms reports every line of a Go or Markdown file under the root
// that matches one of terms (hidden directories and testdata skipped).
// The problem's Link is the matched text.
func (c *Checker) CheckTerms(terms []Term) ([]Problem, error) {
	var probs []Problem
	err := filepath.WalkDir(c.root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != c.root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		ext := filepath.Ext(p)
		if ext != ".go" && !strings.EqualFold(ext, ".md") {
			return nil
		}
		rel := c.rel(p)
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(src), "\n") {
			for _, t := range terms {
				if slices.ContainsFunc(t.Skip, func(dir string) bool { return strings.HasPrefix(rel, dir+"/") }) {
					continue
				}
				for _, m := range t.RE.FindAllString(line, -1) {
					probs = append(probs, Problem{File: rel, Line: i + 1, Link: m, Why: t.Why})
				}
			}
		}
		return nil
	})
	sortProblems(probs)
	return probs, err
}

// walkMarkdown calls fn with every Markdown file under the root, skipping
// hidden directories and other workspaces (directories with a go.work).
func (c *Checker) walkMarkdown(fn func(path string, src []byte)) error {
	return filepath.WalkDir(c.root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != c.root && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.work")); err == nil && p != c.root {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.EqualFold(filepath.Ext(p), ".md") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fn(p, src)
		return nil
	})
}

// forEachProse calls fn with each line of a Markdown file outside fenced
// and indented code blocks, and its line number.
func forEachProse(src []byte, fn func(n int, line string)) {
	fence := ""
	prevBlank, inIndented := true, false
	for i, line := range strings.Split(string(src), "\n") {
		trimmed := strings.TrimLeft(line, " ")
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]) == "" {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			for _, ch := range trimmed[3:] {
				if ch != rune(fence[0]) {
					break
				}
				fence += fence[:1]
			}
			continue
		}
		blank := strings.TrimSpace(line) == ""
		indented := strings.HasPrefix(line, "    ") || strings.HasPrefix(line, "\t")
		if indented && (prevBlank || inIndented) && !blank {
			inIndented, prevBlank = true, false
			continue
		}
		if !blank {
			inIndented = false
		}
		prevBlank = blank
		fn(i+1, line)
	}
}

// Filter removes the problems whose Key is in allow and returns the rest,
// and the allow entries that matched no problem (stale entries).
func Filter(probs []Problem, allow []string) (rest []Problem, stale []string) {
	used := map[string]bool{}
	for _, p := range probs {
		if slices.Contains(allow, p.Key()) {
			used[p.Key()] = true
			continue
		}
		rest = append(rest, p)
	}
	for _, a := range allow {
		if !used[a] {
			stale = append(stale, a)
		}
	}
	return rest, stale
}
