#!/bin/sh
# install_example.sh SOURCE_DIR BUILD_DIR TESSERA — `cmake --install` into
# a temporary prefix, then the README's C example (between the
# readme-example markers) compiled and run with the README's own command
# line, pkg-config finding the installed tessera.pc. Its output must be the
# prompt followed by what `tessera run` generates greedily from the same
# model; the installed library must carry its SONAME and export only ts_*.
set -eu
src=$1 build=$2 tessera=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "install_example: $*" >&2; exit 1; }

"${CMAKE:-cmake}" --install "$build" --prefix "$tmp/prefix" >/dev/null
lib=$(ls "$tmp"/prefix/lib*/libtessera.so.0 2>/dev/null | head -n 1)
[ -n "$lib" ] || fail "no libtessera.so.0 installed under $tmp/prefix"
readelf -d "$lib" | grep -q 'SONAME.*\[libtessera\.so\.0\]' || fail "libtessera.so.0 has no SONAME libtessera.so.0"
others=$(nm -D --defined-only "$lib" | awk '$3 !~ /^ts_/ {print $3}' | head -n 5)
[ -z "$others" ] || fail "libtessera.so exports names outside ts_*: $others"
[ -x "$tmp/prefix/bin/tessera" ] || fail "no bin/tessera installed"
[ -f "$tmp/prefix/include/tessera/tessera.h" ] || fail "no include/tessera/tessera.h installed"

# the C block, then the sh block, inside the markers
sed -n '/<!-- readme-example: begin/,/<!-- readme-example: end/p' "$src/README.md" >"$tmp/block.md"
awk '/^```c$/ {on=1; next} /^```$/ {on=0} on' "$tmp/block.md" >"$tmp/example.c"
cmd=$(awk '/^```sh$/ {on=1; next} /^```$/ {on=0} on' "$tmp/block.md")
[ -s "$tmp/example.c" ] || fail "no C example between the README's markers"
[ -n "$cmd" ] || fail "no build command between the README's markers"
case "$cmd" in
*'$(pkg-config --cflags --libs tessera)'*) ;;
*) fail "the README's build line does not use pkg-config --cflags --libs tessera: $cmd" ;;
esac

ln -s "$src/models" "$tmp/models"
pcdir=$(dirname "$(ls "$tmp"/prefix/lib*/pkgconfig/tessera.pc)")
out=$(cd "$tmp" && PKG_CONFIG_PATH="$pcdir" LD_LIBRARY_PATH="$(dirname "$lib")" \
    TS_NUM_THREADS=2 sh -ec "$cmd") || fail "the README's command failed: $cmd"
# the example must have run against the installed library, not another
LD_LIBRARY_PATH="$(dirname "$lib")" ldd "$tmp/example" | grep -q "$(dirname "$lib")/libtessera.so.0" ||
    fail "the example is not linked to the installed libtessera.so.0"

want="And God said$(TS_NUM_THREADS=2 "$tessera" run -m "$src/models/kjv-qwen3" -p "And God said" -n 16 --temperature 0 2>/dev/null)"
[ "$out" = "$want" ] || fail "the example printed
[$out]
where tessera run gives
[$want]"
echo "install_example: ok: $out"
