#!/usr/bin/env bash
# The strata command line as users script it: the stories260K greedy
# continuation, eval output size, tokenize, exit codes/messages for usage
# errors and bad models, and bench's output (engine speed, the machine's
# bandwidths, the bound they imply).
set -uo pipefail
S=${STRATA_BIN:?}
F=${STRATA_FIXTURES:?}
[ -d "$F/models" ] || { echo "SKIP: no fixtures at $F"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
check() { # name, condition result
	if [ "$2" = 0 ]; then echo "ok $1"; else echo "FAIL $1"; fail=1; fi
}

# 1. The reference continuation of "Once upon a time", 48 tokens, greedy.
want=$(sed -n 's/^<s> Once upon a time//p' "$F/ref/stories260K-once-upon-a-time.txt")
got=$("$S" run -m "$F/models/stories260K.gguf" -p "Once upon a time" -n 48 --temp 0 2>"$T/err")
[ "$got" = "$want" ]; r=$?
check "run: stories260K continuation" $r
[ $r = 0 ] || { echo "  want: [$want]"; echo "  got:  [$got]"; cat "$T/err"; }
grep -q "^strata: prompt .* tok/s.*peak RSS" "$T/err"; check "run: timing on stderr" $?

# 1b. KV cache types: stories260K's text with a q8_0 cache is the reference's
# for at least 32 tokens; a full context stops in one line, or shifts with
# --context-shift and goes on as readable text.
M=$F/models/stories260K.gguf
got=$("$S" run -m "$M" -p "Once upon a time" -n 32 --temp 0 -ctk q8_0 -ctv q8_0 2>"$T/err")
[ -n "$got" ] && [ "${want#"$got"}" != "$want" ]; r=$?
check "run: stories260K continuation with a q8_0 cache, 32 tokens" $r
[ $r = 0 ] || { echo "  want: [$want]"; echo "  got:  [$got]"; cat "$T/err"; }
got=$("$S" run -m "$M" -p "Once upon a time" -n 100 -c 40 --temp 0 2>"$T/err"); st=$?
[ $st = 0 ] && grep -q "^strata: context of 40 tokens is full: generation stopped" "$T/err" &&
	[ "$(grep -c -v '^strata: prompt' "$T/err")" = 1 ]
check "run: a full context stops with one line, exit 0" $?
grep -q "generated 36 tokens" "$T/err"; check "run: ... after the 36 tokens that fit (35 decoded)" $?
for ct in f16 q8_0; do
	got=$("$S" run -m "$M" -p "Once upon a time" -n 300 -c 48 --temp 0 --context-shift --keep 4 \
		-ctk $ct -ctv $ct 2>"$T/err"); st=$?
	[ $st = 0 ] && grep -q "generated 300 tokens" "$T/err" && ! grep -q "full" "$T/err"
	check "run: --context-shift goes past the context ($ct cache)" $?
	# readable: printable ASCII, mostly words the model knows from its stories
	printf '%s' "$got" | LC_ALL=C grep -q '[^[:print:][:space:]]'; r=$?
	words=$(printf '%s' "$got" | tr -cs 'A-Za-z' '\n' | grep -c -x -E 'the|was|a|and|to|She|he|she|He|her|his|play|day|big|with|They|they|saw|Lily|said|it')
	[ $r = 1 ] && [ "$words" -ge 30 ]; r=$?
	check "run: --context-shift text stays readable ($ct cache, $words common words)" $r
	[ $r = 0 ] || echo "  got: [$got]"
done
if [ -f "$F/arch/models/tiny-qwen35-q4_k_m.gguf" ]; then
	"$S" run -m "$F/arch/models/tiny-qwen35-q4_k_m.gguf" -p "Hello there" -n 40 -c 16 --temp 0 \
		--context-shift >/dev/null 2>"$T/err"; st=$?
	[ $st = 0 ] && grep -q "^strata: context of 16 tokens is full: generation stopped (qwen35 has recurrent layers" "$T/err"
	check "run: a hybrid model's full context stops in one line even with --context-shift" $?
fi
# no -c: sized to memory, told in one line (stories260K's 2048 tokens at f16
# fit any machine that runs the tests)
"$S" run -m "$M" -p "Once" -n 1 --temp 0 >/dev/null 2>"$T/err"
grep -q "^strata: context 2048 tokens, KV cache f16/f16 1.2 MiB (.* in all): the largest that fits" "$T/err"
check "run: the context sized to memory, in one line" $?
"$S" run -m "$M" -p "Once" -n 1 --temp 0 -ctk q4_0 >/dev/null 2>"$T/err"
grep -q "^strata: context 2048 tokens, KV cache q4_0/f16" "$T/err"; check "run: sized to memory keeps -ctk" $?
expect_usage_ct() { "$S" run -m "$M" -p hi "$@" >/dev/null 2>"$T/err"; [ $? = 1 ] && grep -q "unknown cache type 'q5_1'" "$T/err"; }
expect_usage_ct -ctk q5_1; check "usage: unknown -ctk type" $?
expect_usage_ct --cache-type-v q5_1; check "usage: unknown --cache-type-v type" $?

# 2. eval writes one float32 row of n_vocab per token.
"$S" eval -m "$F/models/stories260K.gguf" --tokens 1,403,407,261 --logits-out "$T/l.bin"
check "eval: exit 0" $?
[ "$(stat -c %s "$T/l.bin")" = $((4 * 512 * 4)) ]; check "eval: 4 rows of 512 floats" $?
# the batch size changes how tokens are grouped, not what comes out
"$S" eval -m "$F/models/stories260K.gguf" --tokens 1,403,407,261 --logits-out "$T/l3.bin" -b 3 &&
	cmp -s "$T/l.bin" "$T/l3.bin"; check "eval: -b 3 gives the same logits as one batch" $?

# 3. tokenize matches the reference prompt tokens.
got=$("$S" tokenize -m "$F/models/stories260K.gguf" --text "Once upon a time there was a little robot who")
[ "$got" = "1 403 407 261 378 383 286 261 376 352 414 430 309 263 415 414" ]; check "tokenize: stories260K prompt" $?
got=$(printf 'Once upon a time' | "$S" tokenize -m "$F/models/stories260K.gguf" --no-bos)
[ "$got" = "403 407 261 378" ]; check "tokenize: stdin, --no-bos" $?

# 4. Exit codes and one-line messages.
expect() { # name, want-status, command...
	local name=$1 want=$2; shift 2
	"$@" >"$T/out" 2>"$T/err"; local st=$?
	if [ $st = "$want" ] && grep -q '^strata: ' "$T/err"; then echo "ok $name"
	else echo "FAIL $name (status $st, want $want)"; cat "$T/err"; fail=1; fi
}
expect "usage: no command" 1 "$S"
expect "usage: unknown command" 1 "$S" frobnicate
expect "usage: missing -m" 1 "$S" run -p hi
expect "usage: bad -n" 1 "$S" run -m "$F/models/stories260K.gguf" -n lots
expect "usage: bad -b" 1 "$S" run -m "$F/models/stories260K.gguf" -b 0
grep -q "invalid value '0' for option '-b'" "$T/err"; check "usage: the message names the option" $?
expect "usage: unknown option" 1 "$S" bench -m "$F/models/stories260K.gguf" --bogus
expect "bad model: missing file" 2 "$S" run -m "$T/nope.gguf" -p hi
printf 'GGUF\3\0\0\0' >"$T/trunc.gguf"
expect "bad model: truncated header" 2 "$S" run -m "$T/trunc.gguf" -p hi
head -c 600000 "$F/models/stories260K.gguf" >"$T/half.gguf"
expect "bad model: truncated data" 2 "$S" eval -m "$T/half.gguf" --tokens 1 --logits-out "$T/x"
grep -q "half.gguf: truncated" "$T/err"; check "bad model: message names file and problem" $?
expect "bad input: token out of range" 2 "$S" eval -m "$F/models/stories260K.gguf" --tokens 1,512 --logits-out "$T/x"
expect "bad input: token not a number" 2 "$S" eval -m "$F/models/stories260K.gguf" --tokens 1,x --logits-out "$T/x"
expect "bad input: refused vocabulary" 2 "$S" tokenize -m "$F/vocab/ggml-vocab-bert-bge.gguf" --text hi

# 4b. The newer architectures: an unknown one, a missing and a mis-shaped
# tensor each give one line naming it, and exit 2.
A=$F/arch/models
E="python3 $(dirname "$0")/gguf_edit.py"
one_line() { # name, pattern: the message is one line and says what is wrong
	[ "$(wc -l <"$T/err")" = 1 ] && grep -q "$2" "$T/err"; check "$1" $?
}
if [ -d "$A" ]; then
	$E "$A/tiny-qwen3-q4_k_m.gguf" "$T/a.gguf" arch=qwen9
	expect "bad model: unknown architecture" 2 "$S" eval -m "$T/a.gguf" --tokens 1 --logits-out "$T/x"
	one_line "bad model: names the architecture" "architecture 'qwen9' is not supported"
	$E "$A/tiny-qwen3-q4_k_m.gguf" "$T/a.gguf" rename=blk.1.attn_q_norm.weight:blk.1.attn_q_nrom.weight
	expect "bad model: qwen3 without a q norm" 2 "$S" eval -m "$T/a.gguf" --tokens 1 --logits-out "$T/x"
	one_line "bad model: names the missing tensor" "missing tensor 'blk.1.attn_q_norm.weight'"
	$E "$A/tiny-gemma2-q4_k_m.gguf" "$T/a.gguf" rename=blk.3.post_ffw_norm.weight:blk.3.post_ffw_nrom.weight
	expect "bad model: gemma2 without a post-FFN norm" 2 "$S" run -m "$T/a.gguf" -p hi -n 1
	one_line "bad model: names the missing post norm" "missing tensor 'blk.3.post_ffw_norm.weight'"
	$E "$A/tiny-gemma3-q8_0.gguf" "$T/a.gguf" dim=blk.2.attn_k_norm.weight:0:64
	expect "bad model: gemma3 k norm of the wrong size" 2 "$S" eval -m "$T/a.gguf" --tokens 1 --logits-out "$T/x"
	one_line "bad model: names the mis-shaped tensor" "tensor 'blk.2.attn_k_norm.weight' has shape \[64, 1, 1, 1\], expected \[128, 1\]"
	$E "$A/tiny-phi3-q4_k_m.gguf" "$T/a.gguf" dim=blk.0.attn_qkv.weight:1:512
	expect "bad model: phi3 fused qkv short of rows" 2 "$S" eval -m "$T/a.gguf" --tokens 1 --logits-out "$T/x"
	one_line "bad model: names the fused tensor" "tensor 'blk.0.attn_qkv.weight' has shape \[256, 512, 1, 1\], expected \[256, 768\]"
	$E "$A/tiny-phi3-q4_k_m.gguf" "$T/a.gguf" dim=blk.1.ffn_up.weight:1:768
	expect "bad model: phi3 fused gate|up of one half" 2 "$S" eval -m "$T/a.gguf" --tokens 1 --logits-out "$T/x"
	one_line "bad model: names the fused FFN tensor" "tensor 'blk.1.ffn_up.weight' has shape \[256, 768, 1, 1\], expected \[256, 1536\]"
	$E "$A/tiny-qwen35-q4_k_m.gguf" "$T/a.gguf" rename=blk.1.ssm_a:blk.1.ssm_b
	expect "bad model: qwen35 without a DeltaNet decay" 2 "$S" eval -m "$T/a.gguf" --tokens 1 --logits-out "$T/x"
	one_line "bad model: names the missing DeltaNet tensor" "missing tensor 'blk.1.ssm_a'"
	$E "$A/tiny-qwen35-q4_k_m.gguf" "$T/a.gguf" dim=blk.3.attn_q.weight:1:256
	expect "bad model: qwen35 attention q without its gate" 2 "$S" eval -m "$T/a.gguf" --tokens 1 --logits-out "$T/x"
	one_line "bad model: names the gated q" "tensor 'blk.3.attn_q.weight' has shape \\[256, 256, 1, 1\\], expected \\[256, 512\\]"
	$E "$A/tiny-qwen3moe-q4_k_m.gguf" "$T/a.gguf" dim=blk.1.ffn_up_exps.weight:2:7
	expect "bad model: qwen3moe experts short of one" 2 "$S" eval -m "$T/a.gguf" --tokens 1 --logits-out "$T/x"
	one_line "bad model: names the expert tensor" "tensor 'blk.1.ffn_up_exps.weight' has shape \[256, 256, 7, 1\], expected \[256, 256, 8\]"
	$E "$A/tiny-qwen3moe-q4_k_m.gguf" "$T/a.gguf" dim=blk.2.ffn_gate_exps.weight:1:128
	expect "bad model: qwen3moe expert FFN of the wrong size" 2 "$S" eval -m "$T/a.gguf" --tokens 1 --logits-out "$T/x"
	one_line "bad model: names the mis-shaped expert tensor" "tensor 'blk.2.ffn_gate_exps.weight' has shape \[256, 128, 8, 1\], expected \[256, 256, 8\]"
	$E "$A/tiny-qwen3moe-q4_k_m.gguf" "$T/a.gguf" u32=qwen3moe.expert_used_count:9
	expect "bad model: qwen3moe using more experts than it has" 2 "$S" eval -m "$T/a.gguf" --tokens 1 --logits-out "$T/x"
	one_line "bad model: names the expert counts" "invalid expert counts: expert_count 8, expert_used_count 9"
	$E "$A/tiny-qwen3moe-q4_k_m.gguf" "$T/a.gguf" u32=qwen3moe.expert_count:6
	expect "bad model: qwen3moe router wider than its count" 2 "$S" eval -m "$T/a.gguf" --tokens 1 --logits-out "$T/x"
	one_line "bad model: names the router" "tensor 'blk.0.ffn_gate_inp.weight' has shape \[256, 8, 1, 1\], expected \[256, 6\]"
else
	echo "skip newer-architecture errors: no $A"
fi

# 5. bench --json carries the fields scripts read, and the machine's
# bandwidths with the bound they put on decoding (sane, not exact, values).
"$S" bench -m "$F/models/stories260K.gguf" -p 8 -n 4 --json >"$T/b.json"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["prompt_tps"]>0 and d["decode_tps"]>0 and d["peak_rss_bytes"]>0 and 0 <= d["huge_mapped_bytes"] <= d["model_bytes"] and d["huge_mapped_bytes"] % (2 << 20) == 0' "$T/b.json"
check "bench --json fields" $?
python3 - "$T/b.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert 0 < d["token_weight_bytes"] <= d["model_bytes"], d
assert 0.5 < d["mem_read_gbps"] < 10000 and d["mem_read_threads"] >= 1, d
# the probe reads through 2 MiB pages as the weights do, where the kernel
# has transparent huge pages and may compact for a region that asks
h = d["mem_read_huge_bytes"]
assert 0 <= h <= d["mem_read_bytes"] and h % (2 << 20) == 0, d
thp = "/sys/kernel/mm/transparent_hugepage/"
try:
    thp_on = all("[never]" not in open(thp + f).read() for f in ("enabled", "defrag"))
except OSError:
    thp_on = False
assert h > 0 or not thp_on, d
# storage: a number, or n/a with the reason (fixtures on tmpfs)
assert (d["storage_read_gbps"] is not None and d["storage_read_gbps"] > 0.001
        and d["storage_read_bytes"] > 0 and d["storage_read_error"] is None
        and abs(d["stream_bound_tps"] - d["storage_read_gbps"] * 1e9 / d["token_weight_bytes"])
            <= 0.01 * d["stream_bound_tps"] + 0.01) or \
       (d["storage_read_gbps"] is None and d["storage_read_error"]), d
bound = d["mem_read_gbps"] * 1e9 / d["token_weight_bytes"]
assert abs(d["decode_bound_tps"] - bound) <= 0.01 * bound, d
assert abs(d["decode_fraction"] - d["decode_tps"] / d["decode_bound_tps"]) < 0.01, d
assert d["decode_fraction"] > 0, d
# one pair per decoded token, each a memory pass and a token
assert d["paired_tokens"] == 4 and d["paired_fraction"] > 0, d
assert 0.5 < d["paired_mem_read_gbps"] < 10000, d
PY
check "bench --json: bandwidths, decode bound and fraction" $?
# pairs as far as the context has room; none without the machine measured
"$S" bench -m "$F/models/stories260K.gguf" -p 8 -n 4 -c 14 --json >"$T/b14.json" &&
	"$S" bench -m "$F/models/stories260K.gguf" -p 8 -n 4 --no-hw --json >"$T/bnohw.json" &&
	python3 - "$T/b14.json" "$T/bnohw.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["paired_tokens"] == 2 and d["paired_fraction"] > 0, d
d = json.load(open(sys.argv[2]))
assert d["paired_tokens"] == 0 and d["paired_fraction"] is None, d
PY
check "bench: pairs limited by the context, none with --no-hw" $?

num='[0-9]+(\.[0-9]+)?'

# --warmup N: N tokens decoded before measuring (default 1), the first of
# them reported as the cold token; more warm-up tokens than the context
# holds; 0 reports none; a negative count is a usage error.
"$S" bench -m "$F/models/stories260K.gguf" -p 8 -n 4 --no-hw --json >"$T/w1.json" &&
	"$S" bench -m "$F/models/stories260K.gguf" -p 8 -n 4 -c 16 --warmup 40 --no-hw --json >"$T/w40.json" &&
	"$S" bench -m "$F/models/stories260K.gguf" -p 8 -n 4 --warmup 0 --no-hw --json >"$T/w0.json" &&
	python3 - "$T/w1.json" "$T/w40.json" "$T/w0.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["warmup"] == 1 and 0 < d["cold_token_s"] <= d["first_token_s"], d
d = json.load(open(sys.argv[2]))
assert d["warmup"] == 40 and d["cold_token_s"] > 0 and d["decode_tps"] > 0, d
d = json.load(open(sys.argv[3]))
assert d["warmup"] == 0 and d["cold_token_s"] is None and d["first_token_s"] is None, d
PY
check "bench --warmup: cold token, warm-up beyond the context, none" $?
# --random-tokens: the decode feeds tokens of a fixed pseudo-random sequence
# (llama-bench's workload), said so in the output; a trace line a token;
# speculation has nothing to guess then: a usage error.
"$S" bench -m "$F/models/stories260K.gguf" -p 0 -n 6 --no-hw --random-tokens --json \
	--trace "$T/rt.trace" >"$T/rt.json" &&
	python3 - "$T/rt.json" "$T/rt.trace" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["decode_tokens"] == "random" and d["n_decode"] == 6 and d["decode_tps"] > 0, d
assert len(open(sys.argv[2]).read().splitlines()) == 6
PY
check "bench --random-tokens: random tokens, a trace line each" $?
"$S" bench -m "$F/models/stories260K.gguf" -p 8 -n 2 --no-hw --json | grep -q '"decode_tokens": "greedy"'
check "bench: greedy tokens by default" $?
"$S" bench -m "$F/models/stories260K.gguf" -p 8 -n 2 --no-hw --random-tokens | grep -q "^decode .*(random tokens)"
check "bench --random-tokens: the decode line says so" $?
expect "usage: --random-tokens with --lookup" 1 "$S" bench -m "$F/models/stories260K.gguf" --random-tokens --lookup
"$S" bench -m "$F/models/stories260K.gguf" -p 8 -n 4 --no-hw >"$T/w.txt" &&
	grep -Eq "^cold token +$num s +\(the first token after loading" "$T/w.txt"
check "bench: cold token line" $?
expect "usage: negative --warmup" 1 "$S" bench -m "$F/models/stories260K.gguf" --warmup -1
"$S" bench -m "$F/models/stories260K.gguf" -p 8 -n 4 >"$T/b.txt" 2>"$T/err"
check "bench: exit 0" $?
grep -Eq "^memory read  $num GB/s  \([0-9]+ threads" "$T/b.txt" &&
	awk '/^memory read/ { exit !($3 > 0) }' "$T/b.txt"
check "bench: memory read line" $?
grep -Eq "^storage read ($num GB/s  \(O_DIRECT|n/a \(.+\))" "$T/b.txt"
check "bench: storage read line" $?
grep -Eq "^decode bound $num tok/s" "$T/b.txt" &&
	awk '/^decode bound/ { exit !($3 > 0) }' "$T/b.txt"
check "bench: decode bound line" $?
awk '/^fraction / { f = $2 } END { exit !(f > 0) }' "$T/b.txt"
check "bench: fraction line" $?
grep -Eq "^paired       $num of the bound  \(median of 4 tokens" "$T/b.txt"
check "bench: paired line" $?
[ $fail = 0 ] || cat "$T/b.txt" "$T/err"

# The same file on tmpfs has no storage under it: n/a with the reason.
if [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ]; then
	shm=$(mktemp /dev/shm/strata-cli-XXXXXX.gguf)
	cp "$F/models/stories260K.gguf" "$shm"
	"$S" bench -m "$shm" -p 2 -n 2 >"$T/shm.txt"
	grep -q "^storage read n/a (.*tmpfs" "$T/shm.txt"; check "bench: storage n/a on tmpfs" $?
	rm -f "$shm"
fi

# --no-hw: no measurement, null fields, the engine numbers still there.
"$S" bench -m "$F/models/stories260K.gguf" -p 8 -n 4 --no-hw --json >"$T/n.json"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["decode_tps"]>0 and d["mem_read_gbps"] is None and d["decode_bound_tps"] is None and d["storage_read_error"]' "$T/n.json"
check "bench --no-hw --json" $?
"$S" bench -m "$F/models/stories260K.gguf" -p 8 -n 4 --no-hw >"$T/n.txt"
grep -q "^decode " "$T/n.txt" && ! grep -q "^memory read" "$T/n.txt"
check "bench --no-hw: no bandwidth lines" $?
! grep -q "^hint" "$T/n.txt"; check "bench: no repack hint for a model without Q4_0" $?

# A Q4_0 model: the text report says whether strata-repack pays on this CPU,
# measured (so either line, never both), and names it where it does; not
# with --no-hw (no hardware measured), not in the JSON.
"$S" bench -m "$F/models/tiny-llama-q4_0.gguf" -p 4 -n 2 >"$T/q.txt" &&
	[ "$(grep -c -E "^hint .* read [0-9.]+x as fast repacked \((scalar|avx2|avx512|avx512bf16) kernels\), with the same results: strata-repack .*tiny-llama-q4_0.gguf OUT.gguf$|^repack +would not pay here: its Q4_0 matrices read [0-9.]+x as fast repacked" "$T/q.txt")" = 1 ]
check "bench: whether the repack pays, for a Q4_0 model" $?
"$S" bench -m "$F/models/tiny-llama-q4_0.gguf" -p 4 -n 2 --no-hw >"$T/q.txt" &&
	! grep -q -E "^(hint|repack) " "$T/q.txt"
check "bench --no-hw: no repack measurement" $?
"$S" bench -m "$F/models/tiny-llama-q4_0.gguf" -p 4 -n 2 --no-hw --json >"$T/q.json" &&
	python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$T/q.json"
check "bench --json: still JSON for a Q4_0 model" $?
exit $fail
