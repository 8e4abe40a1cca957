#!/usr/bin/env bash
# Downloads, into ./.whl, the wheels of the packages fkjax needs that the
# lent GPU machines lack (they reach no package index). Run here, in the
# repository root, before a device call that names `.whl` in its carry.
set -eu
grep -qx '/.whl/' .git/info/exclude 2>/dev/null \
  || { mkdir -p "$(git rev-parse --git-path info)"; \
       echo '/.whl/' >> "$(git rev-parse --git-path info/exclude)"; }
pins() { grep -iE "^($1)==" requirements.txt; }
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_17_x86_64 --platform any \
  -d .whl $(pins "ml-collections|tensorboardX")
ls -l .whl
