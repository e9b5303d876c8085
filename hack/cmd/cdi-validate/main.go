// Command cdi-validate loads CDI spec files the way container runtimes do, with the upstream CDI
// library (tags.cncf.io/container-device-interface), and checks what the kubelet plugin promises:
// every spec parses strictly and validates, its cdiVersion is the lowest that covers the fields it
// uses, and every CDI device ID given with -id resolves in the cache built from the spec dirs.
//
//	cdi-validate [-id k8s.gpu.nvidia.com/claim=<uid>-gpu-0 ...] <spec file or dir>...
//
// It exits 1 and names each failure when anything does not hold.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

type ids []string

func (i *ids) String() string     { return strings.Join(*i, ",") }
func (i *ids) Set(v string) error { *i = append(*i, v); return nil }

// specFiles lists the .yaml and .json files of a dir, or the file itself.
func specFiles(path string) ([]string, bool, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, false, err
	}
	if !info.IsDir() {
		return []string{path}, false, nil
	}
	var files []string
	for _, ext := range []string{"*.yaml", "*.json"} {
		matches, err := filepath.Glob(filepath.Join(path, ext))
		if err != nil {
			return nil, true, err
		}
		files = append(files, matches...)
	}
	sort.Strings(files)
	return files, true, nil
}

func main() {
	var want ids
	flag.Var(&want, "id", "a fully qualified CDI device ID that must resolve (repeatable)")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: cdi-validate [-id ID ...] <spec file or dir>...")
		os.Exit(2)
	}
	var failures []string
	fail := func(format string, args ...any) { failures = append(failures, fmt.Sprintf(format, args...)) }
	var dirs []string
	checked := 0
	for _, arg := range flag.Args() {
		files, isDir, err := specFiles(arg)
		if err != nil {
			fail("%s: %v", arg, err)
			continue
		}
		if isDir {
			dirs = append(dirs, arg)
		}
		for _, file := range files {
			checked++
			spec, err := cdi.ReadSpec(file, 0)
			if err != nil {
				fail("%s: %v", file, err)
				continue
			}
			lowest, err := specs.MinimumRequiredVersion(spec.Spec)
			if err != nil {
				fail("%s: minimum version: %v", file, err)
			} else if spec.Version != lowest {
				fail("%s: cdiVersion %s, but the lowest covering its fields is %s", file, spec.Version, lowest)
			}
		}
	}
	if len(dirs) > 0 {
		cache, err := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
		if err != nil {
			fail("cache over %v: %v", dirs, err)
		} else {
			for path, errs := range cache.GetErrors() {
				for _, e := range errs {
					fail("cache: %s: %v", path, e)
				}
			}
			for _, id := range want {
				if cache.GetDevice(id) == nil {
					fail("device %s does not resolve in %v", id, dirs)
				}
			}
		}
	} else if len(want) > 0 {
		fail("-id needs a spec dir to resolve in")
	}
	for _, f := range failures {
		fmt.Fprintln(os.Stderr, f)
	}
	if len(failures) > 0 {
		os.Exit(1)
	}
	fmt.Printf("%d spec file(s) valid; %d device ID(s) resolved\n", checked, len(want))
}
