#!/bin/bash
# Copies the shared libraries that the given programs need and a bare lent
# machine may lack: OUT/lib gets what is never there (libchorus, Gloo,
# hiredis), OUT/fallback the rest, for use only where that machine's loader
# finds nothing (the run scripts check with ldd). The C/C++ runtime and Open
# MPI are never packed: the machine's own mpirun needs its own Open MPI.
#   bash scripts/pack-libs.sh OUT PROGRAM...
set -euo pipefail
out=$1
shift
mkdir -p "$out/lib" "$out/fallback"
ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    case $name in
      libc.so*|libm.so*|libstdc++*|libgcc_s*|ld-linux*|libmpi*|libopen-pal*|libopen-rte*) ;;
      libchorus*|libgloo*|libhiredis*) cp -L "$path" "$out/lib/$name" ;;
      *) cp -L "$path" "$out/fallback/$name" ;;
    esac
  done
