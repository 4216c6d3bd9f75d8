#!/usr/bin/env bash
# Renders `vmm-replay advise --report` in headless Chromium and checks the screenshot is not
# blank (outside CI: it needs `apt-get install -y chromium`). Usage:
#   scripts/check_report_render.sh [TRACE] [CAPACITY] [SCREENSHOT.png]
set -euo pipefail
cd "$(dirname "$0")/.."
trace=${1:-../shared/traces/pytorch/cs336-2.7b-ctx128-fullstep.pickle}
capacity=${2:-52GiB}
shot=${3:-$(mktemp -d)/report.png}
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then
  echo "SKIPPED: no chromium (apt-get install -y chromium)" >&2
  exit 0
fi
cargo build --release -q -p vmm-replay --bin vmm-replay
html=$(mktemp -d)/report.html
./target/release/vmm-replay advise "$trace" --capacity "$capacity" --report "$html" >/dev/null
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=${WINDOW:-1280,1600} \
  --screenshot="$shot" "file://$html" >/dev/null 2>&1
python3 - "$shot" <<'PY'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, w, h, ctype = 8, b"", 0, 0, 0
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        w, h, _, ctype = struct.unpack(">IIBB", body[:10])
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
raw = zlib.decompress(idat)
bpp = {2: 3, 6: 4}[ctype]
stride = w * bpp + 1
# Count rows that are not one flat colour (filter byte 0 or any: a flat row compresses to zeros
# after its first pixel under the Sub filter; decode Sub/None only roughly: count non-zero bytes).
busy = sum(1 for r in range(h) if len(set(raw[r * stride + 1 + bpp:(r + 1) * stride])) > 1)
print(f"{sys.argv[1]}: {w}x{h}, {busy} rows with content")
assert busy > h // 10, "the screenshot is (nearly) blank"
PY
echo "rendered: $shot"
