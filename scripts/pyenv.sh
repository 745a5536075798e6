#!/usr/bin/env bash
# Creates or refreshes the Python environment .venv/NAME from scripts/locks/NAME.txt, a lock file with a hash for
# every file (`pip install --require-hashes --no-deps`: exactly what the lock lists, nothing resolved at install
# time). Does nothing when the environment was installed from this very lock; after a change of the lock it is
# built anew, so a package dropped from the lock does not linger.
# Usage: scripts/pyenv.sh NAME...      Prints the environment's folder for each NAME on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
for name in "$@"; do
  lock=scripts/locks/$name.txt
  [[ -f $lock ]] || { echo "pyenv: no lock file $lock" >&2; exit 2; }
  env_dir=.venv/$name
  stamp=$env_dir/.yolo8-installed-lock.txt
  if ! cmp -s "$lock" "$stamp"; then
    echo "pyenv: installing $env_dir from $lock" >&2
    rm -rf "$env_dir"
    python3 -m venv "$env_dir" >&2 || {
      echo "pyenv: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
    "$env_dir/bin/python" -m pip install --quiet --disable-pip-version-check --no-input --require-hashes --no-deps \
      --only-binary=:all: -r "$lock" >&2
    cp "$lock" "$stamp"
  fi
  echo "$root/$env_dir"
done
