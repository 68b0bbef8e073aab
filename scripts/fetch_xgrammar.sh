#!/usr/bin/env bash
# Puts XGrammar's C++ sources (the grammar engine behind structured output)
# into .cache/xgrammar-<version>/ from its PyPI source distribution, checked
# against a pinned hash. CMake builds the C++ core from there (cmake/xgrammar.cmake);
# the Python bindings in the same archive are not used. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.2.9
sha256=87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90
dest=.cache/xgrammar-$version
[ -f "$dest/include/xgrammar/xgrammar.h" ] && exit 0
mkdir -p .cache/sdists
archive=.cache/sdists/xgrammar-$version.tar.gz
if [ ! -s "$archive" ]; then
  # --no-binary for this package only: its build dependencies still come as wheels.
  python3 -m pip download -q --no-deps --no-binary xgrammar -d .cache/sdists "xgrammar==$version"
fi
echo "$sha256  $archive" | sha256sum -c --quiet -
rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
tar xzf "$archive" -C "$dest.tmp" --strip-components=1
mv "$dest.tmp" "$dest"
