// chart-render: `helm template` for this repository's chart, where no helm binary can be had.
//
//	chart-render CHART_DIR [-f values.yaml]... [--set key.path=value]...
//
// Helm renders charts with Go's text/template and the Sprig function library, plus a few
// functions of its own (include, tpl, required, toYaml, fromYaml). This program does the same
// with the same libraries (Debian's golang-github-masterminds-sprig-dev, v3 as Helm 3 uses) and
// Helm's semantics for those functions, so a chart it renders renders under `helm template`
// too. It prints every rendered manifest as one YAML stream, each headed by its source, and
// fails on the first template error (a `required` value unset, a syntax error).
package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/template"

	sprig "github.com/Masterminds/sprig"
	"gopkg.in/yaml.v3"
)

type values = map[string]interface{}

func die(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "chart-render: "+format+"\n", args...)
	os.Exit(1)
}

// merge lays `over` onto `base`, recursing into maps, as Helm merges values files.
func merge(base, over values) values {
	for k, v := range over {
		if vm, ok := v.(values); ok {
			if bm, ok := base[k].(values); ok {
				base[k] = merge(bm, vm)
				continue
			}
		}
		base[k] = v
	}
	return base
}

func readYAML(path string) values {
	raw, err := os.ReadFile(path)
	if err != nil {
		die("%v", err)
	}
	out := values{}
	if err := yaml.Unmarshal(raw, &out); err != nil {
		die("%s: %v", path, err)
	}
	return out
}

// set applies one --set a.b.c=value; the value is parsed as YAML (numbers, booleans, strings).
func set(vals values, assignment string) {
	key, raw, ok := strings.Cut(assignment, "=")
	if !ok {
		die("--set %q: want key.path=value", assignment)
	}
	var v interface{}
	if err := yaml.Unmarshal([]byte(raw), &v); err != nil {
		v = raw
	}
	parts := strings.Split(key, ".")
	m := vals
	for _, p := range parts[:len(parts)-1] {
		next, ok := m[p].(values)
		if !ok {
			next = values{}
			m[p] = next
		}
		m = next
	}
	m[parts[len(parts)-1]] = v
}

func main() {
	if len(os.Args) < 2 {
		die("usage: chart-render CHART_DIR [-f values.yaml]... [--set key=value]...")
	}
	chart := os.Args[1]
	vals := readYAML(filepath.Join(chart, "values.yaml"))
	for i := 2; i < len(os.Args); i++ {
		switch os.Args[i] {
		case "-f":
			i++
			if i == len(os.Args) {
				die("-f needs a file")
			}
			vals = merge(vals, readYAML(os.Args[i]))
		case "--set":
			i++
			if i == len(os.Args) {
				die("--set needs key=value")
			}
			set(vals, os.Args[i])
		default:
			die("unknown argument %q", os.Args[i])
		}
	}
	meta := readYAML(filepath.Join(chart, "Chart.yaml"))

	root := template.New("chart")
	funcs := sprig.TxtFuncMap()
	funcs["toYaml"] = func(v interface{}) string {
		out, err := yaml.Marshal(v)
		if err != nil {
			return ""
		}
		return strings.TrimSuffix(string(out), "\n")
	}
	funcs["fromYaml"] = func(s string) values {
		out := values{}
		_ = yaml.Unmarshal([]byte(s), &out)
		return out
	}
	funcs["required"] = func(msg string, v interface{}) (interface{}, error) {
		if v == nil || v == "" {
			return nil, fmt.Errorf("%s", msg)
		}
		return v, nil
	}
	funcs["include"] = func(name string, data interface{}) (string, error) {
		var buf bytes.Buffer
		err := root.ExecuteTemplate(&buf, name, data)
		return buf.String(), err
	}
	funcs["tpl"] = func(text string, data interface{}) (string, error) {
		t, err := root.Clone()
		if err == nil {
			t, err = t.New("tpl").Parse(text)
		}
		if err != nil {
			return "", err
		}
		var buf bytes.Buffer
		err = t.Execute(&buf, data)
		return buf.String(), err
	}
	root.Funcs(funcs).Option("missingkey=zero")

	files, _ := filepath.Glob(filepath.Join(chart, "templates", "*"))
	sort.Strings(files)
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			die("%v", err)
		}
		if _, err := root.New(filepath.Base(f)).Parse(string(raw)); err != nil {
			die("%v", err)
		}
	}
	data := map[string]interface{}{
		"Values":  vals,
		"Chart":   map[string]interface{}{"Name": meta["name"], "Version": meta["version"], "AppVersion": meta["appVersion"]},
		"Release": map[string]interface{}{"Name": "prime-swarm", "Namespace": "default", "Service": "Helm"},
	}
	for _, f := range files {
		name := filepath.Base(f)
		if strings.HasPrefix(name, "_") || !strings.HasSuffix(name, ".yaml") {
			continue // partials: only `define`s
		}
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, name, data); err != nil {
			die("%v", err)
		}
		body := strings.TrimSpace(buf.String())
		if body == "" {
			continue
		}
		fmt.Printf("---\n# Source: templates/%s\n%s\n", name, body)
	}
}
