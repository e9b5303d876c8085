// Command oci-image writes a single-layer container image as an OCI image layout tar archive, the
// format `ctr images import` reads, without a Docker daemon. The local cluster's real nodes get the
// product's images (and the stand-ins for images that cannot be fetched here) this way.
//
//	oci-image -o image.tar -name REF [-name REF...] [-user U:G] [-entrypoint PATH [-cmd ARG...]]
//	          [-env K=V...] [-add SRC:DST[:MODE]...] [-dir DST[:MODE]...] [-link DST:TARGET...]
//
// The layer is reproducible: entries sorted, owned by root, mtime zero. Parent folders of every
// entry are added with mode 0755.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

// entry is one file, folder or symlink of the layer.
type entry struct {
	typ    byte
	mode   int64
	src    string // file content comes from here
	target string // symlink target
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

func main() {
	var out, user, entrypoint string
	var names, cmd, env, adds, dirs, links list
	flag.StringVar(&out, "o", "", "output archive (OCI image layout, tar)")
	flag.Var(&names, "name", "image reference, e.g. ghcr.io/org/image:tag (repeatable)")
	flag.StringVar(&user, "user", "", "user the image runs as, UID[:GID]")
	flag.StringVar(&entrypoint, "entrypoint", "", "entrypoint program")
	flag.Var(&cmd, "cmd", "default argument (repeatable)")
	flag.Var(&env, "env", "environment entry K=V (repeatable)")
	flag.Var(&adds, "add", "SRC:DST[:MODE] copy a file into the image (repeatable)")
	flag.Var(&dirs, "dir", "DST[:MODE] an empty folder (repeatable)")
	flag.Var(&links, "link", "DST:TARGET a symbolic link (repeatable)")
	flag.Parse()
	if out == "" || len(names) == 0 {
		fail("-o and at least one -name are required")
	}

	entries := map[string]entry{}
	for _, a := range adds {
		parts := strings.Split(a, ":")
		if len(parts) < 2 || len(parts) > 3 {
			fail("-add %q: want SRC:DST[:MODE]", a)
		}
		info, err := os.Stat(parts[0])
		if err != nil {
			fail("-add %q: %v", a, err)
		}
		mode := int64(info.Mode().Perm())
		if len(parts) == 3 {
			mode = parseMode(parts[2])
		}
		entries[clean(parts[1])] = entry{typ: tar.TypeReg, mode: mode, src: parts[0]}
	}
	for _, d := range dirs {
		dst, mode, _ := strings.Cut(d, ":")
		m := int64(0o755)
		if mode != "" {
			m = parseMode(mode)
		}
		entries[clean(dst)] = entry{typ: tar.TypeDir, mode: m}
	}
	for _, l := range links {
		dst, target, ok := strings.Cut(l, ":")
		if !ok {
			fail("-link %q: want DST:TARGET", l)
		}
		entries[clean(dst)] = entry{typ: tar.TypeSymlink, mode: 0o777, target: target}
	}
	for p := range entries {
		for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
			if _, ok := entries[d]; !ok {
				entries[d] = entry{typ: tar.TypeDir, mode: 0o755}
			}
		}
	}

	layer, diffID := writeLayer(entries)
	config := map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"config":       imageConfig(user, entrypoint, cmd, env),
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{diffID}},
		"history":      []map[string]string{{"created_by": "hack/cmd/oci-image"}},
	}
	blobs := map[string][]byte{}
	add := func(mediaType string, data []byte) descriptor {
		sum := sha256.Sum256(data)
		digest := "sha256:" + hex.EncodeToString(sum[:])
		blobs[digest] = data
		return descriptor{MediaType: mediaType, Digest: digest, Size: int64(len(data))}
	}
	configDesc := add("application/vnd.oci.image.config.v1+json", mustJSON(config))
	layerDesc := add("application/vnd.oci.image.layer.v1.tar+gzip", layer)
	manifestDesc := add("application/vnd.oci.image.manifest.v1+json", mustJSON(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        configDesc,
		"layers":        []descriptor{layerDesc},
	}))
	var manifests []descriptor
	for _, n := range names {
		d := manifestDesc
		d.Annotations = map[string]string{"io.containerd.image.name": n, "org.opencontainers.image.ref.name": tagOf(n)}
		manifests = append(manifests, d)
	}
	index := mustJSON(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": manifests})

	var archive bytes.Buffer
	tw := tar.NewWriter(&archive)
	put := func(name string, data []byte) {
		must(tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: time.Unix(0, 0), Format: tar.FormatPAX}))
		_, err := tw.Write(data)
		must(err)
	}
	put("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	put("index.json", index)
	digests := make([]string, 0, len(blobs))
	for d := range blobs {
		digests = append(digests, d)
	}
	sort.Strings(digests)
	for _, d := range digests {
		put("blobs/sha256/"+strings.TrimPrefix(d, "sha256:"), blobs[d])
	}
	must(tw.Close())
	must(os.WriteFile(out, archive.Bytes(), 0o644))
}

func imageConfig(user, entrypoint string, cmd, env list) map[string]any {
	c := map[string]any{"Env": append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, env...)}
	if user != "" {
		c["User"] = user
	}
	if entrypoint != "" {
		c["Entrypoint"] = []string{entrypoint}
	}
	if len(cmd) > 0 {
		c["Cmd"] = []string(cmd)
	}
	return c
}

// writeLayer returns the gzipped layer and the digest of its uncompressed tar (the diff id).
func writeLayer(entries map[string]entry) ([]byte, string) {
	paths := make([]string, 0, len(entries))
	for p := range entries {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, p := range paths {
		e := entries[p]
		h := &tar.Header{Name: p, Typeflag: e.typ, Mode: e.mode, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		var data []byte
		switch e.typ {
		case tar.TypeDir:
			h.Name += "/"
		case tar.TypeSymlink:
			h.Linkname = e.target
		case tar.TypeReg:
			var err error
			data, err = os.ReadFile(e.src)
			must(err)
			h.Size = int64(len(data))
		}
		must(tw.WriteHeader(h))
		if data != nil {
			_, err := tw.Write(data)
			must(err)
		}
	}
	must(tw.Close())
	sum := sha256.Sum256(raw.Bytes())
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	must(err)
	_, err = zw.Write(raw.Bytes())
	must(err)
	must(zw.Close())
	return gz.Bytes(), "sha256:" + hex.EncodeToString(sum[:])
}

// tagOf returns the tag of an image reference ("latest" when it has none).
func tagOf(ref string) string {
	name := ref[strings.LastIndex(ref, "/")+1:]
	if _, tag, ok := strings.Cut(name, ":"); ok {
		return tag
	}
	return "latest"
}

func clean(p string) string { return strings.TrimPrefix(path.Clean("/"+p), "/") }

func parseMode(s string) int64 {
	m, err := strconv.ParseInt(s, 8, 32)
	if err != nil {
		fail("mode %q: want octal, e.g. 0755", s)
	}
	return m
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	must(err)
	return b
}

func must(err error) {
	if err != nil {
		fail("%v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "oci-image: "+format+"\n", args...)
	os.Exit(1)
}
