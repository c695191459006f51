#!/usr/bin/env bash
# Builds the reference documentation: the pages of tools/docs/ and what is generated from the code
# (the command-line reference from the commands' --help; the configuration page's settings table
# from `tierswap config --settings`; the C++ API from Doxygen's XML of include/tierswap/), then Sphinx's HTML with every warning an error. With --check it also checks
# the links (every page and anchor a link names must exist) and, where Chromium is installed,
# takes a headless screenshot of the index page (index.png beside the HTML: it rendered).
#   tools/docs/build.sh BUILD_DIR [--check]      (cmake --build BUILD_DIR --target docs)
set -euo pipefail
build=$(cd "$1" && pwd)
check=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out="$build/docs"
python=/usr/bin/python3
rm -rf "$out/src" "$out/html"
mkdir -p "$out/src" "$out/doxygen"
cp "$here"/*.md "$here/conf.py" "$out/src/"
"$python" "$here/cli_reference.py" "$build/tierswap" "$out/src/cli-reference.md"
# The configuration page's settings table, regenerated from the structs' tables in code.
"$build/tierswap" config --settings > "$out/settings.md"
"$python" - "$out/src/configuration.md" "$out/settings.md" <<'PY'
import re, sys
page, table = (open(p).read() for p in sys.argv[1:])
new, n = re.subn(r"(<!-- settings:[^\n]*\n).*?(<!-- end of settings -->)",
                 lambda m: m.group(1) + table + m.group(2), page, flags=re.S)
if n != 1:
    sys.exit("docs: configuration.md: the settings markers are missing")
open(sys.argv[1], "w").write(new)
PY
sed -e "s|@INPUT@|$root/include/tierswap|" -e "s|@OUTPUT@|$out/doxygen|" "$here/Doxyfile.in" \
  > "$out/Doxyfile"
doxygen "$out/Doxyfile" > "$out/doxygen.log"
export TIERSWAP_DOXYGEN_XML="$out/doxygen/xml" TIERSWAP_PYTHON_DIR="$build/python"
"$python" -m sphinx -W --keep-going -q -b html "$out/src" "$out/html"
echo "docs: $out/html/index.html"
[[ $check == --check ]] || exit 0
# Links: Sphinx's linkcheck (external links are named, not fetched: CI has no network).
"$python" -m sphinx -W --keep-going -q -b linkcheck -D linkcheck_ignore='https?://.*' \
  "$out/src" "$out/linkcheck"
browser=$(command -v chromium || command -v chromium-browser || true)
if [[ -z $browser ]]; then
  echo "docs: no chromium: the screenshot is skipped"
  exit 0
fi
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,900 \
  --screenshot="$out/html/index.png" "file://$out/html/index.html" > "$out/chromium.log" 2>&1
"$python" - "$out/html/index.png" <<'PY'
import sys
from PIL import Image  # python3-pil, with python3-matplotlib
im = Image.open(sys.argv[1]).convert("L")
colors = len(set(im.getdata()))
if im.size != (1280, 900) or colors < 16:
    sys.exit(f"docs: the index page's screenshot is {im.size} with {colors} shades: not rendered")
print(f"docs: screenshot {sys.argv[1]} ({colors} shades)")
PY
