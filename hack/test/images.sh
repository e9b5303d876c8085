#!/usr/bin/env bash
# make test-images: the images `make images` writes (OCI archives, no container engine) and the ones the
# Dockerfiles in images/ build (the publishing path) hold the same binaries at the same paths, run as
# the same user with the same entrypoint. Reads each Dockerfile's final stage (COPY of the binaries,
# USER, ENTRYPOINT) and compares it with the archive's config and layer. Uses debug binaries in a
# folder of its own: what is compared does not depend on the cargo profile.
set -euo pipefail
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPO_DIR="$(dirname "$HACK_DIR")"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
PROFILE=debug IMAGES_OUT="$out" "$HACK_DIR/images.sh" >/dev/null
python3 - "$REPO_DIR" "$out" <<'PY'
import io, json, re, sys, tarfile
repo, out = sys.argv[1], sys.argv[2]
failed = 0

def dockerfile(path):
    """Binaries, their folder, user and entrypoint of a Dockerfile's final stage."""
    # Joined at line continuations, so a `cp` may span several lines.
    text = open(path).read().replace("\\\n", " ")
    final = text[text.rindex("\nFROM "):]
    # The build stage copies the binaries into /out/: `cp target/.../name ... /out/`.
    binaries = set()
    for cp in re.findall(r"\bcp ([^&\n]*?) /out/", text):
        binaries |= {p.rsplit("/", 1)[-1] for p in cp.split()}
    dest = re.search(r"COPY --from=build /out/\S* (\S+)", final).group(1)
    paths = {dest + b if dest.endswith("/") else dest for b in binaries}
    user = re.search(r"^USER (\S+)", final, re.M)
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])", final, re.M).group(1))
    return paths, user.group(1) if user else "", entry

def archive(path):
    """Regular files, user and entrypoint of a single-layer OCI archive."""
    with tarfile.open(path) as t:
        blob = lambda d: t.extractfile("blobs/sha256/" + d.split(":")[1]).read()
        index = json.loads(t.extractfile("index.json").read())
        manifest = json.loads(blob(index["manifests"][0]["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))["config"]
        files = set()
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=io.BytesIO(blob(layer["digest"]))) as l:
                files |= {"/" + m.name for m in l.getmembers() if m.isfile()}
    return files, config.get("User", ""), config.get("Entrypoint", [])

for image in ["gpu-operator", "gpu-kubelet-plugin"]:
    want_paths, want_user, want_entry = dockerfile(f"{repo}/images/{image}.Dockerfile")
    files, user, entry = archive(f"{out}/{image}.tar")
    problems = []
    if not want_paths:
        problems.append("no binary found in the Dockerfile")
    if missing := sorted(want_paths - files):
        problems.append(f"missing {missing}")
    if user != want_user:
        problems.append(f"user {user!r}, Dockerfile {want_user!r}")
    if entry != want_entry:
        problems.append(f"entrypoint {entry}, Dockerfile {want_entry}")
    if problems:
        failed = 1
        print(f"images: FAIL  {image}: " + "; ".join(problems))
    else:
        print(f"images: PASS  {image}: {sorted(want_paths)} as user {want_user or 'root'}, entrypoint {want_entry}")
print("2 passed, 0 failed" if not failed else "images: FAIL")
sys.exit(failed)
PY
