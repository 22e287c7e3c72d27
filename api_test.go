package roche_test

import (
	"flag"
	"fmt"
	"go/ast"
	"go/build"
	"go/doc"
	"go/parser"
	"go/token"
	"os"
	"slices"
	"strings"
	"testing"
)

var updateAPI = flag.Bool("update-api", false, "rewrite testdata/api.txt with what package roche exports now")

// apiFile lists everything package roche exports: its names, and the fields and methods
// of its types. The root package is the user API and only that; what only provider
// authors use lives in provider/kit, what only the CLI parses in internal/cli. A change
// here is a decision about what every user of Roche reads.
const apiFile = "testdata/api.txt"

// TestAPI: package roche exports exactly what testdata/api.txt lists, so that a new
// export (or a field, or a method) is a decision made in a diff of that file; none of
// its names is also provider/kit's, and no parser of command-line strings is among them.
func TestAPI(t *testing.T) {
	got := exports(t, ".")
	if *updateAPI {
		if err := os.WriteFile(apiFile, []byte(strings.Join(got, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(apiFile)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Split(strings.TrimSpace(string(data)), "\n")
	for _, e := range got {
		if !slices.Contains(want, e) {
			t.Errorf("package roche exports %q, which %s does not list: if every user needs it, add it there "+
				"(go test -run TestAPI -update-api .); if only providers do, put it in provider/kit; if only the CLI, in internal/cli", e, apiFile)
		}
	}
	for _, e := range want {
		if !slices.Contains(got, e) {
			t.Errorf("%s lists %q, which package roche no longer exports: remove it there (go test -run TestAPI -update-api .)", apiFile, e)
		}
	}

	kit := exports(t, "provider/kit")
	for _, e := range got {
		kind, name, _ := strings.Cut(e, " ")
		if kind != "field" && kind != "method" && slices.Contains(kit, e) {
			t.Errorf("%s %s is exported by both package roche and provider/kit: a name has one audience", kind, name)
		}
		if kind == "func" && strings.HasPrefix(name, "Parse") {
			t.Errorf("package roche exports %s: parsing command-line strings is the CLI's (internal/cli), not the user API", name)
		}
	}
}

// exports lists what the package in dir exports, one "kind name" an entry, sorted:
// const, var, func and type names, and each exported type's fields and methods as
// "field T.F" and "method T.M" (a struct's fields, an interface's methods too).
func exports(t *testing.T, dir string) []string {
	t.Helper()
	bp, err := build.ImportDir(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range bp.GoFiles {
		f, err := parser.ParseFile(fset, dir+"/"+name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	pkg, err := doc.NewFromFiles(fset, files, "github.com/roche-sandbox/roche/"+dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	values := func(kind string, vs []*doc.Value) {
		for _, v := range vs {
			for _, n := range v.Names {
				if ast.IsExported(n) {
					out = append(out, kind+" "+n)
				}
			}
		}
	}
	values("const", pkg.Consts)
	values("var", pkg.Vars)
	for _, f := range pkg.Funcs {
		out = append(out, "func "+f.Name)
	}
	for _, ty := range pkg.Types {
		out = append(out, "type "+ty.Name)
		values("const", ty.Consts)
		values("var", ty.Vars)
		for _, f := range ty.Funcs {
			out = append(out, "func "+f.Name)
		}
		for _, m := range ty.Methods {
			out = append(out, fmt.Sprintf("method %s.%s", ty.Name, m.Name))
		}
		for _, spec := range ty.Decl.Specs {
			ts := spec.(*ast.TypeSpec)
			var fields *ast.FieldList
			kind := "field"
			switch st := ts.Type.(type) {
			case *ast.StructType:
				fields = st.Fields
			case *ast.InterfaceType:
				fields, kind = st.Methods, "method"
			}
			if fields == nil {
				continue
			}
			for _, f := range fields.List {
				names := f.Names
				if len(names) == 0 { // embedded: its type's name is the field's
					t := f.Type
					if star, ok := t.(*ast.StarExpr); ok {
						t = star.X
					}
					switch t := t.(type) {
					case *ast.Ident:
						names = []*ast.Ident{t}
					case *ast.SelectorExpr:
						names = []*ast.Ident{t.Sel}
					}
				}
				for _, n := range names {
					if ast.IsExported(n.Name) {
						out = append(out, fmt.Sprintf("%s %s.%s", kind, ty.Name, n.Name))
					}
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
