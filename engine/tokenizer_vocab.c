/*
 * tokenizer_vocab.c - the vocabulary: building a tokenizer from a GGUF file
 * (tokens, merges, special tokens, and the pre-tokenizer regexes llama.cpp
 * uses for each tokenizer.ggml.pre, compiled with PCRE2 and collapsed as
 * described in tokenizer.c), and reading it back (a token's text piece, the
 * special ids).  The tokenizer is read-only once built.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem */
#endif
#include "tokenizer_i.h"
#include "gguf.h"

#include <errno.h>
#include <limits.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Token attributes from tokenizer.ggml.token_type (see tokenizer_i.h). */
static const uint16_t type_attr[7] = {
	0, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_CONTROL, ATTR_USER, ATTR_UNUSED, ATTR_BYTE,
};

/* ---- pre-tokenizer table ---------------------------------------------- */

/* Patterns copied from llama.cpp's llm_tokenizer_bpe (non-ASCII characters
 * written as \x{..}: several of them are ones Unicode normalization would
 * silently replace). */
#define CONTRACT "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_LLAMA3                                                                   \
	CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" \
		 "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                  \
	CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" \
		 "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_PUNCT_ASCII "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
#define RE_CJK_KANA "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+"
#define RE_CJK_HANGUL "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
#define RE_PORO " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{0964}\\x{06D4}\\x{060C})]+"
#define RE_UPPER "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define RE_LOWER "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
#define RE_CASED(U, L, C, N, TAIL)                                                          \
	"[^\\r\\n\\p{L}\\p{N}]?" U "*" L "+" C "|[^\\r\\n\\p{L}\\p{N}]?" U "+" L "*" C "|" N \
	"| ?[^\\s\\p{L}\\p{N}]+[\\r\\n" TAIL "]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define LA_UPPER "((?=[\\p{L}])([^a-z]))"
#define LA_LOWER "((?=[\\p{L}])([^A-Z]))"
#define LA_UPPER_M "((?=[\\p{L}\\p{M}])([^a-z]))"
#define LA_LOWER_M "((?=[\\p{L}\\p{M}])([^A-Z]))"

#define PRE_IGNORE_MERGES 1u
#define PRE_ADD_BOS 2u
#define PRE_NO_BOS 4u

struct pre_type {
	const char *names; /* '|'-separated values of tokenizer.ggml.pre */
	unsigned flags;
	const char *re[MAX_RE];
};

static const struct pre_type pre_types[] = {
	{ "default", 0,
	  { "[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]" } },
	{ "llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2|jina-v5-nano",
	  PRE_IGNORE_MERGES | PRE_ADD_BOS, { RE_LLAMA3 } },
	{ "dbrx|smaug-bpe", 0, { RE_LLAMA3 } },
	{ "glm4|chatglm-bpe", PRE_NO_BOS, { RE_LLAMA3 } },
	{ "jais-2", 0,
	  { CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
		     "|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)"
		     "|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)"
		     "|\\s{1,2}(?!\\S)|\\s{1}" } },
	{ "deepseek-llm", 0,
	  { "[\r\n]",
	    "\\s?[A-Za-z\\x{00B5}\\x{00C0}-\\x{00D6}\\x{00D8}-\\x{00F6}\\x{00F8}-\\x{01BA}"
	    "\\x{01BC}-\\x{01BF}\\x{01C4}-\\x{0293}\\x{0295}-\\x{02AF}\\x{0370}-\\x{0373}"
	    "\\x{0376}\\x{0377}\\x{037B}-\\x{037D}\\x{037F}\\x{0386}\\x{0388}-\\x{038A}"
	    "\\x{038C}\\x{038E}-\\x{03A1}\\x{03A3}-\\x{03F5}\\x{03F7}-\\x{0481}"
	    "\\x{048A}-\\x{052F}\\x{0531}-\\x{0556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}"
	    "\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}"
	    "\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"
	    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}"
	    "\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}"
	    "\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}"
	    "\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}"
	    "\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}"
	    "\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}"
	    "\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}"
	    "\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}"
	    "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}"
	    "\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}"
	    "\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"
	    "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}"
	    "\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+",
	    "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}"
	    "\\x{3000}-\\x{3002}]+",
	    "\\s+$", RE_CJK_HANGUL, "\\p{N}+" } },
	{ "deepseek-v3|hunyuan-dense|joyai-llm|hy_v4", 0,
	  { "\\p{N}{1,3}", RE_CJK_KANA,
	    RE_PUNCT_ASCII "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*"
			   "|\\s*[\r\n]+|\\s+(?!\\S)|\\s+" } },
	{ "spark2_5", 0,
	  { "\\p{N}{1,3}", RE_CJK_KANA,
	    RE_PUNCT_ASCII "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]"
			   "|\\s+(?!\\S)|\\s+",
	    "\\p{N}" } },
	{ "youtu", PRE_IGNORE_MERGES,
	  { "[\\x{AC00}-\\x{D7A3}\\x{3131}-\\x{318E}]+|[\\x{FF01}\\x{2026}\\x{201C}\\x{201D}"
	    "\\x{2018}\\x{2019}\\x{2014}\\x{FF1A}\\x{FF1B}\\x{FF0C}\\x{3001}-\\x{303F}"
	    "\\x{FE30}-\\x{FE4F}]+|[\\x{3105}-\\x{312F}]+|" RE_CJK_KANA,
	    RE_CASED(RE_UPPER, RE_LOWER, CONTRACT "?", "\\p{N}", "/") } },
	{ "deepseek-coder", 0,
	  { "[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK_HANGUL, "\\p{N}" } },
	{ "falcon", 0, { "[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]" } },
	{ "starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b|mellum2", 0,
	  { "\\p{N}", RE_GPT2 } },
	{ "gpt-2|phi-2|jina-es|jina-de|gigachat|jina-v2-es|jina-v2-de|a.x-4.0|mellum|modern-bert"
	  "|exaone4|jina-v1-en|jina-v2-code|roberta-bpe|mpt|olmo|jais|trillion|granite-docling",
	  0, { RE_GPT2 } },
	{ "stablelm2|qwen2|deepseek-r1-qwen|kormo|f2llmv2|megrez|hunyuan|solar-open|grok-2", 0,
	  { RE_QWEN2 } },
	{ "qwen35", 0,
	  { CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+"
		     "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" } },
	{ "poro-chat|bloom|gpt3-finnish", 0, { RE_PORO } },
	{ "viking", 0, { RE_PORO, "\\p{N}" } },
	{ "tekken", PRE_IGNORE_MERGES | PRE_ADD_BOS,
	  { RE_CASED(LA_UPPER, LA_LOWER, "", "\\p{N}", "/") } },
	{ "chameleon", PRE_ADD_BOS,
	  { "<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )",
	    "\\p{N}", "[\\p{P}!-/:-@\\[-`{-~]", RE_GPT2 } },
	{ "gpt-4o|llama4|kanana2|talkie|minimax-m2", 0,
	  { RE_CASED(LA_UPPER, LA_LOWER, CONTRACT "?", "\\p{N}{1,3}", "/") } },
	{ "granite-embed-multi-97m", PRE_IGNORE_MERGES,
	  { RE_CASED(LA_UPPER_M, LA_LOWER_M, CONTRACT "?", "\\p{N}{1,3}", "/") } },
	{ "tiny_aya|cohere2moe", 0,
	  { "\\d{1,3}(?=(?:\\d{3})*\\b)",
	    RE_CASED(RE_UPPER, RE_LOWER, CONTRACT "?", "\\p{N}{1,3}", "/") } },
	{ "superbpe", 0, { "\\p{N}+", "(?=(\\d{3})+(?!\\d))" } },
	{ "bailingmoe|bailingmoe2|llada-moe", 0,
	  { "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
	    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+" } },
	{ "seed-coder", 0,
	  { CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+"
		     "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" } },
	{ "ufakzeka", 0,
	  { "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+"
	    "|\\s+(?!\\S)|\\s+" } },
	{ "laguna", 0, { "[^\\n]+|[\\n]+", RE_QWEN2 } },
	{ "exaone-moe", 0,
	  { CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}"
		     "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+" } },
	{ "minicpm5", PRE_IGNORE_MERGES,
	  { "\\p{N}{1,3}",
	    CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
		     "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" } },
};

static bool name_in(const char *names, struct gguf_str s)
{
	for (const char *p = names;;) {
		const char *e = strchr(p, '|');
		size_t n = e ? (size_t)(e - p) : strlen(p);

		if (n == s.len && !memcmp(p, s.ptr, n))
			return true;
		if (!e)
			return false;
		p = e + 1;
	}
}

/* llama.cpp's unicode categories and their collapsed stand-ins. */
static const struct {
	const char *name;
	uint8_t cat;
} ucat[] = {
	{ "\\p{N}", CAT_N },  { "\\p{L}", CAT_L },  { "\\p{P}", CAT_P },  { "\\p{M}", CAT_M },
	{ "\\p{S}", CAT_S },  { "\\p{Lu}", CAT_L }, { "\\p{Ll}", CAT_L }, { "\\p{Lt}", CAT_L },
	{ "\\p{Lm}", CAT_L }, { "\\p{Lo}", CAT_L },
};

/* The ASCII members of each class, in std::regex bracket syntax. */
static const char *ucat_ascii(uint8_t cat)
{
	switch (cat) {
	case CAT_N:
		return "0-9";
	case CAT_L:
		return "A-Za-z";
	case CAT_P:
		return "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}";
	case CAT_S:
		return "\\$\\+<->^`\\|"; /* sic: no '~' */
	default:
		return "";
	}
}

static bool uses_ucat(const char *re)
{
	for (size_t i = 0; i < sizeof(ucat) / sizeof(ucat[0]); i++)
		if (strstr(re, ucat[i].name))
			return true;
	return false;
}

/* llama.cpp's rewrite of a pattern for the collapsed text: \p{X} becomes
 * [<cat byte><ASCII members>] (without the brackets inside a class). */
static char *collapse_regex(const char *re)
{
	size_t n = strlen(re);
	char *o = malloc(n * 8 + 1), *w = o;
	bool inside = false;

	if (!o)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		if (re[i] == '[' && (i == 0 || re[i - 1] != '\\')) {
			*w++ = '[';
			inside = true;
			continue;
		}
		if (inside && re[i] == ']' && re[i - 1] != '\\') {
			*w++ = ']';
			inside = false;
			continue;
		}
		if (re[i] == '\\' && i + 3 < n && re[i + 1] == 'p' && re[i + 2] == '{') {
			const char *close = strchr(re + i + 3, '}');
			size_t k;

			for (k = 0; close && (size_t)(close - re) <= i + 10 &&
				    k < sizeof(ucat) / sizeof(ucat[0]);
			     k++) {
				size_t len = (size_t)(close - re) - i + 1;

				if (strlen(ucat[k].name) == len && !memcmp(re + i, ucat[k].name, len))
					break;
			}
			if (close && (size_t)(close - re) <= i + 10 &&
			    k < sizeof(ucat) / sizeof(ucat[0])) {
				const char *ascii = ucat_ascii(ucat[k].cat);

				if (!inside)
					*w++ = '[';
				*w++ = (char)ucat[k].cat;
				memcpy(w, ascii, strlen(ascii));
				w += strlen(ascii);
				if (!inside)
					*w++ = ']';
				i = (size_t)(close - re);
				continue;
			}
		}
		*w++ = re[i];
	}
	*w = '\0';
	return o;
}

static int compile_re(struct eng_tokenizer *t, const char *re, char *err, size_t errlen)
{
	uint32_t opts = PCRE2_DOLLAR_ENDONLY; /* ECMAScript's $: the very end only */
	char *pat = NULL;
	pcre2_code *code;
	PCRE2_SIZE eoff;
	int ecode;

	if (uses_ucat(re)) {
		pat = collapse_regex(re);
		if (!pat)
			return tok_seterr(err, errlen, -ENOMEM, "out of memory");
		t->need_collapse = true;
		t->re_collapsed[t->n_re] = true;
	} else {
		opts |= PCRE2_UTF;
		t->need_wide = true;
	}
	code = pcre2_compile((PCRE2_SPTR)(pat ? pat : re), PCRE2_ZERO_TERMINATED, opts, &ecode,
			     &eoff, NULL);
	free(pat);
	if (!code) {
		PCRE2_UCHAR msg[120];

		pcre2_get_error_message(ecode, msg, sizeof(msg));
		return tok_seterr(err, errlen, -EINVAL, "pre-tokenizer regex %u: %s at %zu", t->n_re,
			      (const char *)msg, (size_t)eoff);
	}
	t->re[t->n_re++] = code;
	return 0;
}

/* ---- create ----------------------------------------------------------- */

/* Texts llama.cpp recognizes special tokens by (llama_vocab::impl::load). */
static const char *const eot_texts[] = {
	"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
	"<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
	"<\uff5cend\u2581of\u2581sentence\uff5c>", "<end_of_utterance>",
	NULL,
};
static const char *const eom_texts[] = { "<|eom_id|>", NULL };
static const char *const fim_pre_texts[] = {
	"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
	"<\uff5cfim\u2581begin\uff5c>", "<PRE>", "\u2581<PRE>",
	"<|code_prefix|>", "<|prefix|>", NULL,
};
static const char *const fim_suf_texts[] = {
	"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
	"<\uff5cfim\u2581hole\uff5c>", "<SUF>", "\u2581<SUF>",
	"<|code_suffix|>", "<|suffix|>", NULL,
};
static const char *const fim_mid_texts[] = {
	"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
	"<\uff5cfim\u2581end\uff5c>", "<MID>", "\u2581<MID>",
	"<|code_middle|>", "<|middle|>", NULL,
};
static const char *const fim_pad_texts[] = {
	"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL,
};
static const char *const fim_rep_texts[] = {
	"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL,
};
static const char *const fim_sep_texts[] = { "<|file_sep|>", NULL };
static const char *const eog_texts[] = {
	"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
	"<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>",
	"[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>",
	"<|tool_response>",
	"<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[", NULL,
};

enum { SP_BOS, SP_EOS, SP_EOT, SP_EOM, SP_UNK, SP_FIM_PRE, SP_FIM_SUF, SP_FIM_MID, SP_FIM_PAD,
       SP_FIM_REP, SP_FIM_SEP, SP_COUNT };

static const struct {
	const char *key;
	int which;
} special_keys[] = {
	{ "tokenizer.ggml.bos_token_id", SP_BOS },
	{ "tokenizer.ggml.eos_token_id", SP_EOS },
	{ "tokenizer.ggml.eot_token_id", SP_EOT },
	{ "tokenizer.ggml.eom_token_id", SP_EOM },
	{ "tokenizer.ggml.unknown_token_id", SP_UNK },
	{ "tokenizer.ggml.fim_pre_token_id", SP_FIM_PRE },
	{ "tokenizer.ggml.fim_suf_token_id", SP_FIM_SUF },
	{ "tokenizer.ggml.fim_mid_token_id", SP_FIM_MID },
	{ "tokenizer.ggml.fim_pad_token_id", SP_FIM_PAD },
	{ "tokenizer.ggml.fim_rep_token_id", SP_FIM_REP },
	{ "tokenizer.ggml.fim_sep_token_id", SP_FIM_SEP },
	{ "tokenizer.ggml.prefix_token_id", SP_FIM_PRE }, /* deprecated names */
	{ "tokenizer.ggml.suffix_token_id", SP_FIM_SUF },
	{ "tokenizer.ggml.middle_token_id", SP_FIM_MID },
};

/* llama.cpp picks the first token whose text is in the list while iterating
 * a hash map; list order is the deterministic version of that.  The token
 * found is made a control token. */
static void detect(struct eng_tokenizer *t, int32_t *id, const char *const *list)
{
	if (*id >= 0)
		return;
	for (; *list; list++) {
		int32_t f = tok_find_cstr(t, *list);

		if (f >= 0) {
			*id = f;
			t->attr[f] |= ATTR_CONTROL;
			return;
		}
	}
}

static int32_t eog_with_text(const struct eng_tokenizer *t, const char *s)
{
	int32_t id = tok_find_cstr(t, s);

	return id >= 0 && (t->attr[id] & ATTR_EOG) ? id : -1;
}

static void set_attr(struct eng_tokenizer *t, const char *s, uint16_t bit, bool on)
{
	int32_t id = tok_find_cstr(t, s);

	if (id >= 0)
		t->attr[id] = on ? t->attr[id] | bit : t->attr[id] & ~bit;
}

static bool str_has(struct gguf_str s, const char *needle, bool fold)
{
	size_t n = strlen(needle);

	for (size_t i = 0; i + n <= s.len; i++) {
		size_t k;

		for (k = 0; k < n; k++) {
			char c = s.ptr[i + k];

			if (fold && c >= 'A' && c <= 'Z')
				c = (char)(c - 'A' + 'a');
			if (c != needle[k])
				break;
		}
		if (k == n)
			return true;
	}
	return false;
}

struct special_ent {
	uint32_t n;
	int32_t id;
};

static int cmp_special(const void *a, const void *b)
{
	const struct special_ent *x = a, *y = b;

	if (x->n != y->n)
		return x->n > y->n ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

/* The tokens with text whose attributes (of user-defined, control and
 * unknown) are exactly one of those in `kinds`, longest first; llama.cpp's
 * std::sort leaves ties in no particular order, ids make it deterministic. */
static int special_list(const struct eng_tokenizer *t, uint16_t kinds, int32_t **out,
			uint32_t *n_out)
{
	const uint16_t mask = ATTR_USER | ATTR_CONTROL | ATTR_UNKNOWN;
	struct special_ent *e;
	uint32_t n = 0, k = 0;

	for (uint32_t id = 0; id < t->n_vocab; id++)
		if ((t->attr[id] & mask & kinds) && !(t->attr[id] & mask & ~kinds) && t->text[id].n)
			n++;
	*out = NULL;
	*n_out = 0;
	if (!n)
		return 0;
	e = malloc(n * sizeof(*e));
	*out = malloc(n * sizeof(**out));
	if (!e || !*out) {
		free(e);
		return -ENOMEM;
	}
	for (uint32_t id = 0; id < t->n_vocab; id++)
		if ((t->attr[id] & mask & kinds) && !(t->attr[id] & mask & ~kinds) && t->text[id].n)
			e[k++] = (struct special_ent){ t->text[id].n, (int32_t)id };
	qsort(e, n, sizeof(*e), cmp_special);
	for (k = 0; k < n; k++)
		(*out)[k] = e[k].id;
	free(e);
	*n_out = n;
	return 0;
}

/* Special ids, EOG set and attribute adjustments, in llama.cpp's order. */
static int setup_specials(struct eng_tokenizer *t, const struct gguf *g, int32_t *sp,
			  char *err, size_t errlen)
{
	struct gguf_str name = { "", 0 }, pre = { "", 0 }, arch = { "", 0 };
	int32_t end_id;
	bool call;
	int rc;

	for (size_t i = 0; i < sizeof(special_keys) / sizeof(special_keys[0]); i++) {
		uint32_t v;

		rc = gguf_get_u32(g, special_keys[i].key, &v);
		if (rc == -ENOENT)
			continue;
		if (rc)
			return tok_seterr(err, errlen, -EINVAL, "%s is not an unsigned integer",
				      special_keys[i].key);
		/* llama.cpp warns and keeps its default; a file that names a
		 * token it does not have is corrupt */
		if (v >= t->n_vocab)
			return tok_seterr(err, errlen, -EINVAL, "%s = %u is out of range (%u tokens)",
				      special_keys[i].key, v, t->n_vocab);
		sp[special_keys[i].which] = (int32_t)v;
	}

	detect(t, &sp[SP_EOT], eot_texts);
	detect(t, &sp[SP_EOM], eom_texts);
	detect(t, &sp[SP_FIM_PRE], fim_pre_texts);
	detect(t, &sp[SP_FIM_SUF], fim_suf_texts);
	detect(t, &sp[SP_FIM_MID], fim_mid_texts);
	detect(t, &sp[SP_FIM_PAD], fim_pad_texts);
	detect(t, &sp[SP_FIM_REP], fim_rep_texts);
	detect(t, &sp[SP_FIM_SEP], fim_sep_texts);

	if (sp[SP_FIM_PAD] >= 0)
		t->attr[sp[SP_FIM_PAD]] |= ATTR_EOG;
	if (sp[SP_FIM_REP] >= 0)
		t->attr[sp[SP_FIM_REP]] |= ATTR_EOG;
	if (sp[SP_FIM_SEP] >= 0)
		t->attr[sp[SP_FIM_SEP]] |= ATTR_EOG;
	for (const char *const *e = eog_texts; *e; e++) {
		int32_t id = tok_find_cstr(t, *e);

		if (id >= 0)
			t->attr[id] |= ATTR_EOG | ATTR_CONTROL;
	}
	/* gpt-oss: these are printed, not hidden */
	for (const char *const *e = (const char *const[]){ "<|channel|>", "<|message|>",
							   "<|start|>", "<|constrain|>", NULL };
	     *e; e++) {
		int32_t id = tok_find_cstr(t, *e);

		if (id >= 0)
			t->attr[id] = (t->attr[id] & ATTR_EOG) | ATTR_USER;
	}
	if (sp[SP_EOS] >= 0)
		t->attr[sp[SP_EOS]] |= ATTR_EOG;
	if (sp[SP_EOT] >= 0)
		t->attr[sp[SP_EOT]] |= ATTR_EOG;
	if (sp[SP_EOM] >= 0)
		t->attr[sp[SP_EOM]] |= ATTR_EOG;

	/* o200k_harmony and solar-open: there <|end|> ends a message, not the
	 * generation */
	end_id = eog_with_text(t, "<|end|>");
	call = eog_with_text(t, "<|call|>") >= 0 || eog_with_text(t, "<|calls|>") >= 0;
	if (end_id >= 0 && call &&
	    (eog_with_text(t, "<|return|>") >= 0 || eog_with_text(t, "<|flush|>") >= 0))
		t->attr[end_id] = ATTR_USER;
	/* gemma4 and paddleocr: </s> is text there */
	end_id = eog_with_text(t, "</s>");
	if (end_id >= 0 && eog_with_text(t, "<|tool_response>") >= 0)
		t->attr[end_id] = ATTR_NORMAL;

	/* the user-defined tokens tokenize() cuts out of the text; and with
	 * the control and unknown ones, what eng_tokenize_special does */
	if ((rc = special_list(t, ATTR_USER, &t->special, &t->n_special)) ||
	    (rc = special_list(t, ATTR_USER | ATTR_CONTROL | ATTR_UNKNOWN, &t->special_all,
			       &t->n_special_all)))
		return tok_seterr(err, errlen, rc, "out of memory");

	/* per-model strip attributes, chosen by name as llama.cpp does */
	gguf_get_str(g, "general.name", &name);
	gguf_get_str(g, "tokenizer.ggml.pre", &pre);
	gguf_get_str(g, "general.architecture", &arch);
	if (str_has(pre, "jina-v2-de", false) || str_has(pre, "jina-v2-es", false) ||
	    str_has(pre, "jina-v2-code", false) || str_has(arch, "nomic-bert-moe", false) ||
	    str_has(arch, "jina-bert-v3", false)) {
		set_attr(t, "<mask>", ATTR_LSTRIP, true);
	} else if (str_has(name, "phi-3", true) || str_has(name, "phi3", true)) {
		for (uint32_t id = 0; id < t->n_vocab; id++)
			if (t->attr[id] & (ATTR_CONTROL | ATTR_USER | ATTR_UNKNOWN))
				t->attr[id] |= ATTR_RSTRIP;
		set_attr(t, "</s>", ATTR_RSTRIP, true);
		set_attr(t, "<unk>", ATTR_RSTRIP, false);
		set_attr(t, "<s>", ATTR_RSTRIP, false);
		set_attr(t, "<|endoftext|>", ATTR_RSTRIP, false);
	} else if (str_has(name, "modern-bert", true)) {
		set_attr(t, "[MASK]", ATTR_LSTRIP, true);
	}
	return 0;
}

static int load_tokens(struct eng_tokenizer *t, const struct gguf *g, char *err, size_t errlen)
{
	const struct gguf_kv *kv = gguf_find_kv(g, "tokenizer.ggml.tokens");
	const uint8_t *p;
	uint32_t dup_a, dup_b;
	int rc;

	if (!kv)
		return tok_seterr(err, errlen, -EINVAL, "tokenizer.ggml.tokens is missing");
	if (kv->type != GGUF_VT_ARRAY || kv->v.arr.type != GGUF_VT_STRING)
		return tok_seterr(err, errlen, -EINVAL, "tokenizer.ggml.tokens is not an array of strings");
	if (kv->v.arr.n == 0)
		return tok_seterr(err, errlen, -EINVAL, "tokenizer.ggml.tokens is empty");
	if (kv->v.arr.n > MAX_TOKENS)
		return tok_seterr(err, errlen, -EINVAL, "tokenizer.ggml.tokens has %llu tokens (at most %u)",
			      (unsigned long long)kv->v.arr.n, MAX_TOKENS);
	t->n_vocab = (uint32_t)kv->v.arr.n;
	t->text = calloc(t->n_vocab, sizeof(*t->text));
	t->score = calloc(t->n_vocab, sizeof(*t->score));
	t->attr = calloc(t->n_vocab, sizeof(*t->attr));
	if (!t->text || !t->score || !t->attr)
		return tok_seterr(err, errlen, -ENOMEM, "out of memory");
	p = kv->v.arr.data;
	for (uint32_t i = 0; i < t->n_vocab; i++) {
		struct gguf_str s = gguf_arr_next_str(&p);

		if (s.len > MAX_TOKEN_LEN)
			return tok_seterr(err, errlen, -EINVAL, "token %u is %llu bytes long", i,
				      (unsigned long long)s.len);
		t->text[i].p = s.ptr;
		t->text[i].n = (uint32_t)s.len;
		t->attr[i] = ATTR_NORMAL;
	}

	kv = gguf_find_kv(g, "tokenizer.ggml.scores");
	if (kv) {
		if (kv->type != GGUF_VT_ARRAY ||
		    (kv->v.arr.type != GGUF_VT_F32 && kv->v.arr.type != GGUF_VT_I32))
			return tok_seterr(err, errlen, -EINVAL,
				      "tokenizer.ggml.scores is not an array of f32 or i32");
		if (kv->v.arr.n != t->n_vocab)
			return tok_seterr(err, errlen, -EINVAL,
				      "tokenizer.ggml.scores has %llu entries for %u tokens",
				      (unsigned long long)kv->v.arr.n, t->n_vocab);
		for (uint32_t i = 0; i < t->n_vocab; i++) {
			if (kv->v.arr.type == GGUF_VT_F32) {
				memcpy(&t->score[i], kv->v.arr.data + 4 * (size_t)i, 4);
			} else {
				int32_t v;

				memcpy(&v, kv->v.arr.data + 4 * (size_t)i, 4);
				t->score[i] = (float)v;
			}
		}
	}

	kv = gguf_find_kv(g, "tokenizer.ggml.token_type");
	if (kv) {
		if (kv->type != GGUF_VT_ARRAY || kv->v.arr.type != GGUF_VT_I32)
			return tok_seterr(err, errlen, -EINVAL,
				      "tokenizer.ggml.token_type is not an array of i32");
		if (kv->v.arr.n != t->n_vocab)
			return tok_seterr(err, errlen, -EINVAL,
				      "tokenizer.ggml.token_type has %llu entries for %u tokens",
				      (unsigned long long)kv->v.arr.n, t->n_vocab);
		for (uint32_t i = 0; i < t->n_vocab; i++) {
			int32_t v;

			memcpy(&v, kv->v.arr.data + 4 * (size_t)i, 4);
			if (v < 0 || v > 6)
				return tok_seterr(err, errlen, -EINVAL,
					      "token %u has type %d (known types are 0 to 6)", i, v);
			t->attr[i] = type_attr[v];
		}
	}

	rc = tok_map_build(&t->vocab, t->text, t->n_vocab, &dup_a, &dup_b);
	if (rc)
		return tok_seterr(err, errlen, rc, "out of memory");
	if (dup_a != UINT32_MAX) {
		char s[40];

		return tok_seterr(err, errlen, -EINVAL, "tokens %u and %u have the same text '%s'", dup_a,
			      dup_b, tok_printable(s, sizeof(s), t->text[dup_a].p, t->text[dup_a].n));
	}
	return 0;
}

static int load_merges(struct eng_tokenizer *t, const struct gguf *g, char *err, size_t errlen)
{
	const struct gguf_kv *kv = gguf_find_kv(g, "tokenizer.ggml.merges");
	const uint8_t *p;
	uint32_t dup_a, dup_b;

	if (!kv)
		return tok_seterr(err, errlen, -EINVAL, "tokenizer.ggml.merges is missing");
	if (kv->type != GGUF_VT_ARRAY || kv->v.arr.type != GGUF_VT_STRING)
		return tok_seterr(err, errlen, -EINVAL, "tokenizer.ggml.merges is not an array of strings");
	if (kv->v.arr.n > MAX_MERGES)
		return tok_seterr(err, errlen, -EINVAL, "tokenizer.ggml.merges has %llu entries (at most %u)",
			      (unsigned long long)kv->v.arr.n, MAX_MERGES);
	t->n_merges = (uint32_t)kv->v.arr.n;
	t->merge = calloc(t->n_merges ? t->n_merges : 1, sizeof(*t->merge));
	if (!t->merge)
		return tok_seterr(err, errlen, -ENOMEM, "out of memory");
	p = kv->v.arr.data;
	for (uint32_t i = 0; i < t->n_merges; i++) {
		struct gguf_str s = gguf_arr_next_str(&p);

		/* "left right", split at the first space after the first byte */
		if (s.len < 3 || s.len > 2 * (uint64_t)MAX_TOKEN_LEN + 1 ||
		    !memchr(s.ptr + 1, ' ', s.len - 1)) {
			char m[40];

			return tok_seterr(err, errlen, -EINVAL,
				      "tokenizer.ggml.merges[%u] '%s' is not two tokens and a space",
				      i, tok_printable(m, sizeof(m), s.ptr, s.len));
		}
		t->merge[i].p = s.ptr;
		t->merge[i].n = (uint32_t)s.len;
	}
	/* a repeated merge keeps its first (best) rank, as in llama.cpp */
	if (tok_map_build(&t->merges, t->merge, t->n_merges, &dup_a, &dup_b))
		return tok_seterr(err, errlen, -ENOMEM, "out of memory");
	return 0;
}

static int get_bool(const struct gguf *g, const char *key, bool *v, char *err, size_t errlen)
{
	int rc = gguf_get_bool(g, key, v);

	if (rc == -ENOENT)
		return 0;
	if (rc)
		return tok_seterr(err, errlen, -EINVAL, "%s is not a bool", key);
	return 0;
}

int eng_tokenizer_create(const struct gguf *g, struct eng_tokenizer **out, char *err, size_t errlen)
{
	struct eng_tokenizer *t;
	struct gguf_str model, pre = { "", 0 };
	const struct pre_type *pt = NULL;
	int32_t sp[SP_COUNT];
	char s[40];
	int rc;

	*out = NULL;
	if (errlen)
		err[0] = '\0';
	rc = gguf_get_str(g, "tokenizer.ggml.model", &model);
	if (rc == -ENOENT)
		return tok_seterr(err, errlen, -EINVAL, "tokenizer.ggml.model is missing");
	if (rc)
		return tok_seterr(err, errlen, -EINVAL, "tokenizer.ggml.model is not a string");
	if (!gguf_str_eq(model, "llama") && !gguf_str_eq(model, "gpt2"))
		return tok_seterr(err, errlen, -ENOTSUP, "tokenizer model '%s' is not supported",
			      tok_printable(s, sizeof(s), model.ptr, model.len));

	t = calloc(1, sizeof(*t));
	if (!t)
		return tok_seterr(err, errlen, -ENOMEM, "out of memory");
	for (int i = 0; i < SP_COUNT; i++)
		sp[i] = -1;
	t->bpe = gguf_str_eq(model, "gpt2");
	if (t->bpe) {
		rc = gguf_get_str(g, "tokenizer.ggml.pre", &pre);
		if (rc && rc != -ENOENT) {
			rc = tok_seterr(err, errlen, -EINVAL, "tokenizer.ggml.pre is not a string");
			goto err_free;
		}
		/* a missing pre-tokenizer means "default", with a warning in
		 * llama.cpp */
		if (rc == -ENOENT)
			pre = (struct gguf_str){ "default", 7 };
		for (size_t i = 0; i < sizeof(pre_types) / sizeof(pre_types[0]) && !pt; i++)
			if (name_in(pre_types[i].names, pre))
				pt = &pre_types[i];
		if (!pt) {
			rc = tok_seterr(err, errlen, -ENOTSUP, "pre-tokenizer '%s' is not supported",
				    tok_printable(s, sizeof(s), pre.ptr, pre.len));
			goto err_free;
		}
		t->ignore_merges = pt->flags & PRE_IGNORE_MERGES;
		t->add_bos = pt->flags & PRE_ADD_BOS;
		sp[SP_BOS] = pt->flags & PRE_NO_BOS ? -1 : 11;
		sp[SP_EOS] = 11;
	} else {
		t->add_bos = true;
		t->add_space_prefix = true;
		sp[SP_BOS] = 1;
		sp[SP_EOS] = 2;
		sp[SP_UNK] = 0;
	}
	rc = get_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err, errlen);
	if (rc)
		goto err_free;

	rc = load_tokens(t, g, err, errlen);
	if (rc)
		goto err_free;
	/* defaults the vocabulary is too small for are dropped (llama.cpp) */
	for (int i = 0; i < SP_COUNT; i++)
		if (sp[i] >= 0 && (uint32_t)sp[i] >= t->n_vocab)
			sp[i] = -1;
	if (t->bpe) {
		rc = load_merges(t, g, err, errlen);
		if (rc)
			goto err_free;
	}
	rc = setup_specials(t, g, sp, err, errlen);
	if (rc)
		goto err_free;
	t->bos = sp[SP_BOS];
	t->eos = sp[SP_EOS];
	t->unk = sp[SP_UNK];
	rc = get_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos, err, errlen);
	if (rc)
		goto err_free;
	if (t->add_bos && t->bos < 0) {
		rc = tok_seterr(err, errlen, -EINVAL,
			    "tokenizer.ggml.add_bos_token is true but there is no BOS token");
		goto err_free;
	}

	if (!t->bpe) {
		for (int b = 0; b < 256; b++) {
			char hex[8];
			char c = (char)b;

			snprintf(hex, sizeof(hex), "<0x%02X>", b);
			t->byte_tok[b] = tok_find_cstr(t, hex);
			if (t->byte_tok[b] < 0)
				t->byte_tok[b] = tok_find_token(t, &c, 1);
		}
	} else {
		int ecode;
		PCRE2_SIZE eoff;

		for (unsigned i = 0; i < MAX_RE && pt->re[i]; i++) {
			rc = compile_re(t, pt->re[i], err, errlen);
			if (rc)
				goto err_free;
		}
		if (t->need_collapse) {
			t->cat_re = pcre2_compile(
				(PCRE2_SPTR) "(\\p{L})|(\\p{N})|(\\p{P})|(\\p{M})|(\\p{S})",
				PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &ecode,
				&eoff, NULL);
			if (!t->cat_re) {
				rc = tok_seterr(err, errlen, -ENOMEM, "cannot compile the class regex");
				goto err_free;
			}
		}
	}
	*out = t;
	return 0;

err_free:
	eng_tokenizer_destroy(t);
	return rc;
}

void eng_tokenizer_destroy(struct eng_tokenizer *t)
{
	if (!t)
		return;
	for (unsigned i = 0; i < t->n_re; i++)
		pcre2_code_free(t->re[i]);
	pcre2_code_free(t->cat_re);
	free(t->special);
	free(t->special_all);
	tok_map_free(&t->merges);
	free(t->merge);
	tok_map_free(&t->vocab);
	free(t->attr);
	free(t->score);
	free(t->text);
	free(t);
}

/* ---- reading it back: pieces and special ids ------------------------- */

/* Writes what fits, counts everything (saturating: llama.cpp's [UNK_BYTE_..]
 * form repeats the whole token text per odd character). */
struct piece {
	char *buf;
	size_t cap, n;
};

static void put(struct piece *p, const void *s, size_t n)
{
	if (p->n < p->cap)
		memcpy(p->buf + p->n, s, n < p->cap - p->n ? n : p->cap - p->n);
	p->n = n > SIZE_MAX - p->n ? SIZE_MAX : p->n + n;
}

static int parse_byte_token(struct skey k)
{
	static const char hex[] = "0123456789ABCDEF0123456789abcdef";
	const char *h, *l;

	if (k.n != 6 || memcmp(k.p, "<0x", 3) || k.p[5] != '>')
		return -1;
	h = memchr(hex, k.p[3], 32);
	l = memchr(hex, k.p[4], 32);
	if (!h || !l || !k.p[3] || !k.p[4])
		return -1;
	return (int)((h - hex) % 16 * 16 + (l - hex) % 16);
}

int eng_token_to_piece(const struct eng_tokenizer *t, int32_t id, char *buf, size_t bufsz)
{
	struct piece p = { buf, buf ? bufsz : 0, 0 };
	struct skey k;
	uint16_t attr;

	if (!t || id < 0 || (uint32_t)id >= t->n_vocab)
		return -EINVAL;
	k = t->text[id];
	attr = t->attr[id];
	if (attr & (ATTR_UNKNOWN | ATTR_CONTROL)) {
		/* nothing: BOS, EOS and their kind print as "" */
	} else if (attr & ATTR_USER) {
		put(&p, k.p, k.n);
	} else if ((attr & ATTR_NORMAL) && !t->bpe) {
		for (uint32_t i = 0; i < k.n;) {
			if (k.n - i >= 3 && !memcmp(k.p + i, "\xe2\x96\x81", 3)) {
				put(&p, " ", 1);
				i += 3;
			} else {
				put(&p, k.p + i++, 1);
			}
		}
	} else if (attr & ATTR_NORMAL) {
		/* undo the byte alphabet (llama_decode_text) */
		for (size_t i = 0; i < k.n;) {
			uint32_t cp = tok_decode_cpt((const uint8_t *)k.p, k.n, &i);
			int b = tok_cpt_to_byte(cp);

			if (b >= 0) {
				uint8_t c = (uint8_t)b;

				put(&p, &c, 1);
			} else {
				uint8_t u[4];
				size_t nu = tok_encode_cpt(cp, u);
				char hex[3];

				put(&p, "[UNK_BYTE_0x", 12);
				for (size_t j = 0; j < nu; j++) {
					snprintf(hex, sizeof(hex), "%02x", u[j]);
					put(&p, hex, 2);
				}
				put(&p, k.p, k.n);
				put(&p, "]", 1);
			}
		}
	} else if (attr & ATTR_BYTE) {
		int b = parse_byte_token(k);

		if (b >= 0) {
			uint8_t c = (uint8_t)b;

			put(&p, &c, 1);
		} else {
			put(&p, k.p, k.n);
		}
	}
	/* unused and undefined tokens print as "" too, as in llama.cpp */
	if (p.n < p.cap)
		buf[p.n] = '\0';
	return p.n > INT_MAX ? INT_MAX : (int)p.n;
}

uint32_t eng_tokenizer_n_vocab(const struct eng_tokenizer *t)
{
	return t->n_vocab;
}

int32_t eng_tokenizer_bos(const struct eng_tokenizer *t)
{
	return t->bos;
}

int32_t eng_tokenizer_eos(const struct eng_tokenizer *t)
{
	return t->eos;
}

bool eng_tokenizer_is_eog(const struct eng_tokenizer *t, int32_t id)
{
	return id >= 0 && (uint32_t)id < t->n_vocab && (t->attr[id] & ATTR_EOG);
}

bool eng_tokenizer_adds_bos(const struct eng_tokenizer *t)
{
	return t->add_bos && t->bos >= 0;
}

