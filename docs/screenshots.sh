#!/usr/bin/env bash
# A docs check, not part of the test suite: build the site and take screenshots of the home page, a tutorial
# and the benchmarks page with headless Chromium (Debian: `apt-get install chromium`), into docs/screenshots/.
# The site is served from localhost only: nothing is fetched from another host (the formulas need MathJax,
# which the site serves itself).
#
#     docs/screenshots.sh            # from the repository root, with flowkit importable (PYTHONPATH=.)
set -euo pipefail
cd "$(dirname "$0")/.."
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then
    echo "no Chromium found: apt-get install chromium (Debian), then run this again" >&2
    exit 1
fi
site=$(mktemp -d)/site
NO_MKDOCS_2_WARNING=1 python -m mkdocs build --strict --quiet -d "$site"
port=${PORT:-8765}
python -m http.server "$port" --bind 127.0.0.1 --directory "$site" > /dev/null 2>&1 &
server=$!
trap 'kill "$server"' EXIT
sleep 1
out=docs/screenshots
mkdir -p "$out"
shot() {  # name, path, height
    "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size="1280,$3" \
        --virtual-time-budget=15000 --screenshot="$out/$1.png" "http://127.0.0.1:$port/$2" 2> /dev/null
    echo "wrote $out/$1.png"
}
shot home "" 2200
shot tutorial tutorials/09_lattice_phi4/ 2600
shot benchmarks benchmarks/ 2400
# Fewer colours, a fraction of the bytes: the screenshots are committed.
python - "$out" <<'PY'
import sys
from pathlib import Path

from PIL import Image

for path in sorted(Path(sys.argv[1]).glob("*.png")):
    Image.open(path).convert("RGB").quantize(colors=128).save(path, optimize=True)
    print(f"{path}: {path.stat().st_size // 1024} KiB")
PY
