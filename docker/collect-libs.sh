#!/bin/sh
# collect-libs.sh DEST [--skip PREFIX]... BINARY...
# Copies the shared libraries the binaries load (as ldd resolves them, dereferenced, under their
# soname) into DEST, so a runtime image needs none of the -dev packages' runtime counterparts by
# name. Left out: glibc and the C++ runtime (the runtime base image, the same OS release, has
# them) and libraries under any --skip prefix (copied whole by the Dockerfile). Fails when a
# library does not resolve.
set -eu
dest=$1
shift
skips=""
while [ "${1:-}" = "--skip" ]; do
  skips="$skips $2"
  shift 2
done
mkdir -p "$dest"
if ldd "$@" | grep -q "not found"; then
  ldd "$@" | grep "not found" >&2
  exit 1
fi
ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
while read -r soname path; do
  case "$soname" in
    libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|libutil.so.*|libresolv.so.*|\
    ld-linux*|libstdc++.so.*|libgcc_s.so.*) continue ;;
  esac
  skip=no
  for p in $skips; do
    case "$path" in "$p"/*) skip=yes ;; esac
  done
  [ "$skip" = yes ] && continue
  cp -L "$path" "$dest/$soname"
done
