#!/usr/bin/env bash
# Mixtures of experts end to end: strata-mkmodel's qwen3moe shape (cut to 2
# layers of 16 experts) loads and runs; a batch grouped by expert gives the
# logits of one token at a time, bit for bit (the kernels' rows do not
# depend on how many tokens share them, and the experts' outputs are summed
# in the router's order either way); --router-skew changes the routers'
# bytes and nothing else; bad options are one line, exit 1.
#
# usage: moe_test.sh STRATA-MKMODEL   (STRATA_BIN, STRATA_FIXTURES from meson)
set -uo pipefail
S=${STRATA_BIN:?}
F=${STRATA_FIXTURES:?}
MK=${1:?usage: moe_test.sh STRATA-MKMODEL}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
check() { # name, condition result
	if [ "$2" = 0 ]; then echo "ok $1"; else echo "FAIL $1"; fail=1; fi
}

args=(--shape qwen3moe-30b-a3b --type q4_k_m --layers 2 --experts 16 --vocab 512 --ctx 256)
"$MK" "${args[@]}" -o "$T/a.gguf" 2>"$T/err"; check "mkmodel: qwen3moe-30b-a3b, 2 layers of 16 experts" $?
"$MK" "${args[@]}" --router-skew 3 -o "$T/b.gguf" 2>"$T/err"; check "mkmodel: the same with --router-skew 3" $?

# Only the routers differ: 2 layers x [2048, 16] F32 = 262144 bytes at most
# (a byte that happens to agree is not counted).
n=$(cmp -l "$T/a.gguf" "$T/b.gguf" | wc -l)
[ "$(stat -c %s "$T/a.gguf")" = "$(stat -c %s "$T/b.gguf")" ] && [ "$n" -gt 0 ] && [ "$n" -le 262144 ]
check "mkmodel: --router-skew changes the routers only ($n bytes)" $?

"$S" run -m "$T/a.gguf" -c 256 -p "once upon a time" -n 8 >/dev/null 2>"$T/err"
check "run: the synthetic mixture generates" $?

# 60 tokens, 8 of 16 experts each: in a batch most experts serve many tokens
toks=$(seq -s, 3 2 121)
for m in a b; do
	for b in 1 7 64; do
		"$S" eval -m "$T/$m.gguf" -c 256 --tokens "$toks" -b $b --logits-out "$T/$m.$b" 2>"$T/err" ||
			{ cat "$T/err"; fail=1; }
	done
	cmp -s "$T/$m.1" "$T/$m.7" && cmp -s "$T/$m.1" "$T/$m.64"
	check "eval: $m batched by 7 and 64 is one token at a time, bit for bit" $?
done
! cmp -s "$T/a.1" "$T/b.1"; check "eval: the skewed router routes differently" $?

M=$F/arch/models/tiny-qwen3moe-q4_k_m.gguf
if [ -f "$M" ]; then
	"$S" eval -m "$M" --tokens "$toks" -b 1 --logits-out "$T/f.1" 2>"$T/err" &&
		"$S" eval -m "$M" --tokens "$toks" -b 60 --logits-out "$T/f.60" 2>"$T/err" &&
		cmp -s "$T/f.1" "$T/f.60"
	check "eval: the fixture batched is one token at a time, bit for bit" $?
fi

expect1() { # name, command...: exit 1 and one line
	local name=$1; shift
	"$@" >/dev/null 2>"$T/err"; local st=$?
	[ $st = 1 ] && grep -q '^strata-mkmodel: ' "$T/err"; check "$name" $?
}
expect1 "mkmodel: --router-skew on a dense shape" "$MK" --shape tiny --type q4_0 --router-skew 1 -o "$T/x.gguf"
expect1 "mkmodel: fewer experts than a token uses" "$MK" "${args[@]}" --experts 4 -o "$T/x.gguf"
expect1 "mkmodel: a negative skew" "$MK" "${args[@]}" --router-skew -1 -o "$T/x.gguf"
[ ! -e "$T/x.gguf" ]; check "mkmodel: nothing written on a usage error" $?
exit $fail
