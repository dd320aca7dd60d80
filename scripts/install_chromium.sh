#!/usr/bin/env bash
# Install Debian's Chromium for `onnxfuse view --screenshot` and tests/test_view.py, plus two small fonts:
# DejaVu for Netron's text and WenQuanYi Micro Hei for the 〈64×176〉 brackets Netron draws around weight shapes
# (without it they render as empty boxes).
# Idempotent: installs only what is missing, and does nothing when /usr/bin/chromium and the fonts are there.
# Needs root (or passwordless sudo) and apt. Non-interactive.
# Why a script: it installs system packages as root, which `onnxfuse view` should never do by itself (it says
# where to get Chromium and points here instead).
set -euo pipefail

missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
for pkg in fonts-dejavu-core fonts-wqy-microhei; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "chromium already installed: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_chromium.sh: apt-get not found; install Chromium with your package manager so /usr/bin/chromium exists" >&2
    exit 1
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO=(sudo -n)
    else
        echo "install_chromium.sh: needs root: sudo apt-get install chromium fonts-dejavu-core fonts-wqy-microhei" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive
echo "installing: ${missing[*]}"
"${SUDO[@]}" apt-get update -q
"${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"

if [ ! -x /usr/bin/chromium ]; then
    echo "install_chromium.sh: apt-get finished but /usr/bin/chromium is missing" >&2
    exit 1
fi
echo "installed $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
