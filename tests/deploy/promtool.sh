#!/bin/sh
# promtool ARGS..., or CTest's skip (77) where promtool is missing (Debian package `prometheus`; scripts/setup.sh
# installs it, so CI runs these checks).
if ! command -v promtool >/dev/null 2>&1; then
  echo "SKIP: promtool not found (Debian package prometheus; scripts/setup.sh installs it)"
  exit 77
fi
exec promtool "$@"
