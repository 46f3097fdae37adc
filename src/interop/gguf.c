/* loom export --gguf (docs/inference.md "GGUF export"): a loom checkpoint -> one GGUF v3 file
 * for llama.cpp / Ollama.
 *
 * The tensors are the model's Hugging Face tensors (loom_hf_model_tensors: what `loom export
 * --hf` writes) converted as llama.cpp's convert_hf_to_gguf.py converts them: llama.cpp's
 * names (token_embd, blk.N.attn_q, ..., output_norm, output), GPT-2's Conv1D matrices
 * transposed back to (out, in), and for the `llama` architecture (Llama, Mistral) the rows of
 * q and k permuted from Hugging Face's rotate-half RoPE layout to ggml's interleaved one
 * (within each head, row j * D/2 + i goes to 2i + j). The container: header (magic, version 3,
 * counts), metadata key/values, tensor infos (name, dims innermost first, type, offset), the
 * data aligned to 32 bytes. Written to OUT.tmp.<pid>, fsynced and renamed: a failed export
 * leaves no OUT. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/bf16.h"
#include "loom/chat.h"
#include "loom/fp16.h"
#include "loom/hf.h"
#include "loom/interop.h"
#include "loom/backend.h"
#include "loom/load.h"
#include "loom/tokenizer.h"

enum { GGUF_ALIGN = 32 };
enum { GT_U8 = 0, GT_U32 = 4, GT_I32 = 5, GT_F32 = 6, GT_BOOL = 7, GT_STR = 8, GT_ARR = 9 };
enum { GGML_F32 = 0, GGML_Q8_0 = 8, GGML_Q4_K = 12, GGML_BF16 = 30 };

/* a growing byte buffer */
typedef struct gbuf {
    char *p;
    size_t n, cap;
} gbuf;

static void put(gbuf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 4096;
        b->p = loom_realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u32(gbuf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(gbuf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(gbuf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

/* the metadata: key/values counted as they are added */
typedef struct gkv {
    gbuf b;
    uint64_t n;
} gkv;
static void kv_key(gkv *k, const char *key, uint32_t type) {
    put_str(&k->b, key);
    put_u32(&k->b, type);
    k->n++;
}
static void kv_str(gkv *k, const char *key, const char *v) {
    kv_key(k, key, GT_STR);
    put_str(&k->b, v);
}
static void kv_u32(gkv *k, const char *key, uint32_t v) {
    kv_key(k, key, GT_U32);
    put_u32(&k->b, v);
}
static void kv_f32(gkv *k, const char *key, float v) {
    kv_key(k, key, GT_F32);
    put(&k->b, &v, 4);
}
static void kv_bool(gkv *k, const char *key, int v) {
    kv_key(k, key, GT_BOOL);
    const uint8_t u = v != 0;
    put(&k->b, &u, 1);
}
static void kv_arr(gkv *k, const char *key, uint32_t type, uint64_t n) {
    kv_key(k, key, GT_ARR);
    put_u32(&k->b, type);
    put_u64(&k->b, n);
}

/* ---- names ------------------------------------------------------------------------------ */

/* llama.cpp's name of a Hugging Face tensor (arch_llama: Llama-style names; else GPT-2's), or
 * NULL; *transpose: a Conv1D matrix; *qk: 1 q rows, 2 k rows (the RoPE permutation) */
static int gguf_name(const char *hf, int gpt2, char *out, size_t size, int *transpose, int *qk) {
    *transpose = 0;
    *qk = 0;
    static const struct { const char *hf, *gg; } glob_llama[] = {
        {"model.embed_tokens.weight", "token_embd.weight"},
        {"model.norm.weight", "output_norm.weight"},
        {"lm_head.weight", "output.weight"}};
    static const struct { const char *hf, *gg; } glob_gpt2[] = {
        {"transformer.wte.weight", "token_embd.weight"},
        {"transformer.wpe.weight", "position_embd.weight"},
        {"transformer.ln_f.weight", "output_norm.weight"},
        {"transformer.ln_f.bias", "output_norm.bias"}};
    static const struct { const char *hf, *gg; int tr, qk; } layer_llama[] = {
        {"input_layernorm", "attn_norm", 0, 0},  {"self_attn.q_proj", "attn_q", 0, 1},
        {"self_attn.k_proj", "attn_k", 0, 2},    {"self_attn.v_proj", "attn_v", 0, 0},
        {"self_attn.o_proj", "attn_output", 0, 0}, {"post_attention_layernorm", "ffn_norm", 0, 0},
        {"mlp.gate_proj", "ffn_gate", 0, 0},     {"mlp.up_proj", "ffn_up", 0, 0},
        {"mlp.down_proj", "ffn_down", 0, 0}};
    static const struct { const char *hf, *gg; int tr, qk; } layer_gpt2[] = {
        {"ln_1", "attn_norm", 0, 0},     {"attn.c_attn", "attn_qkv", 1, 0},
        {"attn.c_proj", "attn_output", 1, 0}, {"ln_2", "ffn_norm", 0, 0},
        {"mlp.c_fc", "ffn_up", 1, 0},    {"mlp.c_proj", "ffn_down", 1, 0}};
    const int ng = gpt2 ? 4 : 3;
    for (int i = 0; i < ng; i++) {
        const char *h = gpt2 ? glob_gpt2[i].hf : glob_llama[i].hf;
        if (!strcmp(hf, h)) {
            snprintf(out, size, "%s", gpt2 ? glob_gpt2[i].gg : glob_llama[i].gg);
            return 0;
        }
    }
    const char *pre = gpt2 ? "transformer.h." : "model.layers.";
    if (strncmp(hf, pre, strlen(pre)) != 0) return -1;
    char *end = NULL;
    const long l = strtol(hf + strlen(pre), &end, 10);
    if (end == hf + strlen(pre) || *end != '.') return -1;
    const char *rest = end + 1, *suffix = strrchr(rest, '.');
    if (!suffix || (strcmp(suffix, ".weight") && strcmp(suffix, ".bias"))) return -1;
    const size_t mod = (size_t)(suffix - rest);
    const int nl = gpt2 ? 6 : 9;
    for (int i = 0; i < nl; i++) {
        const char *h = gpt2 ? layer_gpt2[i].hf : layer_llama[i].hf;
        if (strlen(h) == mod && !strncmp(rest, h, mod)) {
            snprintf(out, size, "blk.%ld.%s%s", l, gpt2 ? layer_gpt2[i].gg : layer_llama[i].gg,
                     suffix);
            *transpose = (gpt2 ? layer_gpt2[i].tr : layer_llama[i].tr) && !strcmp(suffix, ".weight");
            *qk = gpt2 ? 0 : layer_llama[i].qk;
            return 0;
        }
    }
    return -1;
}

/* ---- the tokenizer ---------------------------------------------------------------------- */

/* llama.cpp's pre-tokenizer name for the tokenizer's split regex (its tokenizer.json) */
static const char *pre_name(json_t *tj) {
    const char *s = json_dumps(json_object_get(tj, "pre_tokenizer"), JSON_COMPACT);
    const char *name = "default";
    if (s && strstr(s, "'s|'t|'re|'ve|'m|'ll|'d| ?\\\\p{L}+| ?\\\\p{N}+")) name = "gpt-2";
    else if (s && strstr(s, "\\\\p{N}{1,3}")) name = "llama-bpe";
    else if (s && strstr(s, "ByteLevel")) name = "gpt-2"; /* ByteLevel alone: GPT-2's split */
    free((void *)s);
    return name;
}

/* tokenizer.ggml.*: tokens by id (the model's vocab_size of them: ids the tokenizer lacks are
 * [PADn], unused), their types, the merges, bos / eos */
static int put_tokenizer(gkv *k, const loom_tokenizer *tok, int V, const char *jinja,
                         loom_err *err) {
    char *text = loom_tokenizer_hf_json(tok);
    json_error_t je;
    json_t *tj = json_loads(text, 0, &je);
    free(text);
    json_t *model = tj ? json_object_get(tj, "model") : NULL;
    json_t *vocab = model ? json_object_get(model, "vocab") : NULL;
    json_t *merges = model ? json_object_get(model, "merges") : NULL;
    if (!json_is_object(vocab) || (merges && !json_is_array(merges))) {
        json_decref(tj);
        return loom_errf(err, "the checkpoint's tokenizer has no byte-level BPE vocabulary "
                              "to write as tokenizer.ggml.tokens");
    }
    char **tokens = loom_calloc((size_t)V, sizeof *tokens);
    int32_t *types = loom_calloc((size_t)V, sizeof *types);
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        const json_int_t id = json_integer_value(val);
        if (id >= 0 && id < V && !tokens[id]) tokens[id] = loom_strdup(key), types[id] = 1;
    }
    json_t *added = json_object_get(tj, "added_tokens");
    size_t i;
    json_array_foreach(added, i, val) {
        const json_int_t id = json_integer_value(json_object_get(val, "id"));
        const char *content = json_string_value(json_object_get(val, "content"));
        if (id < 0 || id >= V || !content) continue;
        free(tokens[id]);
        tokens[id] = loom_strdup(content);
        types[id] = json_is_true(json_object_get(val, "special")) ? 3 : 4; /* control, user */
    }
    kv_str(k, "tokenizer.ggml.model", "gpt2");
    kv_str(k, "tokenizer.ggml.pre", pre_name(tj));
    kv_arr(k, "tokenizer.ggml.tokens", GT_STR, (uint64_t)V);
    for (int t = 0; t < V; t++) {
        char pad[32];
        snprintf(pad, sizeof pad, "[PAD%d]", t);
        put_str(&k->b, tokens[t] ? tokens[t] : pad);
    }
    kv_arr(k, "tokenizer.ggml.token_type", GT_I32, (uint64_t)V);
    for (int t = 0; t < V; t++) put_u32(&k->b, (uint32_t)(tokens[t] ? types[t] : 5));
    const size_t nm = merges ? json_array_size(merges) : 0;
    kv_arr(k, "tokenizer.ggml.merges", GT_STR, nm);
    json_array_foreach(merges, i, val) {
        if (json_is_string(val)) {
            put_str(&k->b, json_string_value(val));
        } else { /* ["a", "b"] */
            const char *a = json_string_value(json_array_get(val, 0));
            const char *b = json_string_value(json_array_get(val, 1));
            const size_t la = a ? strlen(a) : 0, lb = b ? strlen(b) : 0;
            put_u64(&k->b, la + 1 + lb);
            put(&k->b, a ? a : "", la);
            put(&k->b, " ", 1);
            put(&k->b, b ? b : "", lb);
        }
    }
    const char *const eos_names[] = {"<|endoftext|>", "<|im_end|>", "</s>", "<|eot_id|>", "<eos>"};
    int32_t eos = -1;
    for (size_t e = 0; e < sizeof eos_names / sizeof *eos_names && eos < 0; e++)
        eos = loom_tokenizer_special_id(tok, eos_names[e]);
    if (eos >= 0 && eos < V) {
        kv_u32(k, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
        kv_u32(k, "tokenizer.ggml.bos_token_id", (uint32_t)eos); /* as the HF export's config */
    }
    kv_bool(k, "tokenizer.ggml.add_bos_token", 0); /* loom's prompts start with no BOS */
    if (jinja) kv_str(k, "tokenizer.chat_template", jinja);
    for (int t = 0; t < V; t++) free(tokens[t]);
    free(tokens);
    free(types);
    json_decref(tj);
    return 0;
}

/* ---- tensors ------------------------------------------------------------------------------ */

typedef struct gtensor {
    char name[96];
    const float *src; /* HF layout (rows, cols) or (n) */
    int64_t rows, cols; /* 1-D: rows = 1 */
    int ndim, transpose, qk, type;
    uint64_t off, bytes;
} gtensor;

static uint64_t type_bytes(int type, int64_t n) {
    return type == GGML_Q8_0   ? (uint64_t)n / 32 * 34
           : type == GGML_Q4_K ? (uint64_t)n / LOOM_Q4K_BLOCK * LOOM_Q4K_BYTES
           : type == GGML_BF16 ? (uint64_t)n * 2
                               : (uint64_t)n * 4;
}

/* row r of the tensor as llama.cpp holds it (cols floats): transposed back from Conv1D's
 * (in, out), or q / k rows permuted from rotate-half to interleaved pairs (heads of D rows) */
static void gguf_row(const gtensor *t, int64_t r, int D, float *dst) {
    if (t->transpose) { /* src is (cols, rows) in HF: element (r, c) = src[c][r] */
        for (int64_t c = 0; c < t->cols; c++) dst[c] = t->src[c * t->rows + r];
        return;
    }
    int64_t s = r;
    if (t->qk) { /* ggml row h*D + 2i + j holds HF row h*D + j*D/2 + i */
        const int64_t h = r / D, w = r % D, i = w / 2, j = w % 2;
        s = h * D + j * (D / 2) + i;
    }
    memcpy(dst, t->src + s * t->cols, (size_t)t->cols * sizeof(float));
}

static int write_all(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n ? 0 : -1; }

int loom_gguf_export(const char *ckpt, const char *out, const char *type_name, loom_err *err) {
    int want = -1;
    if (!strcmp(type_name, "f32")) want = GGML_F32;
    else if (!strcmp(type_name, "bf16")) want = GGML_BF16;
    else if (!strcmp(type_name, "q8_0")) want = GGML_Q8_0;
    else if (!strcmp(type_name, "q4_k")) want = GGML_Q4_K;
    else return loom_errf(err, "--type '%s': expected f32, bf16, q8_0 or q4_k", type_name);
    loom_model *m = NULL;
    loom_config *cfg = NULL;
    loom_run_data *rd = NULL;
    loom_tokenizer *tok = NULL;
    loom_chat_template *tpl = NULL;
    loom_st_tensor *hts = NULL;
    gtensor *ts = NULL;
    char *jinja = NULL, tmp[4200] = "";
    int nh = 0, nt = 0, rc = -1;
    FILE *f = NULL;
    gkv kv = {0};
    gbuf info = {0};
    float *row = NULL;
    void *packed = NULL;
    if (loom_load_model_lora(ckpt, 1, 0, &m, &cfg, &rd, NULL, err)) return -1;
    const loom_model_config *c = loom_model_get_config(m);
    const loom_arch *a = loom_config_arch(c);
    const char *mt = NULL;
    if (c->head != LOOM_HEAD_LM) {
        loom_errf(err, "%s: a classifier (model.head = classify) has no GGUF architecture", ckpt);
        goto done;
    }
    if (loom_hf_model_tensors(m, &hts, &nh, &mt, err)) {
        loom_err_prefix(err, "%s", ckpt);
        goto done;
    }
    const char *arch = !strcmp(mt, "llama") || !strcmp(mt, "mistral") ? "llama"
                       : !strcmp(mt, "qwen2") ? "qwen2" : !strcmp(mt, "gpt2") ? "gpt2" : NULL;
    if (!arch) {
        loom_errf(err, "%s: architecture '%s' has no GGUF export yet (llama, mistral, qwen2 and "
                       "gpt2 have)", ckpt, mt);
        goto done;
    }
    int windowed = 0;
    for (int l = 0; l < c->n_layer; l++) windowed |= loom_config_layer_window(c, l) > 0;
    if (windowed || a->rope_type != LOOM_ROPE_DEFAULT) {
        loom_errf(err, "%s: %s: llama.cpp's '%s' would not compute it exactly (GGUF export "
                       "writes the default RoPE and full attention only)", ckpt,
                  windowed ? "model.arch.sliding_window" : "model.arch.rope_type", arch);
        goto done;
    }
    const int gpt2 = !strcmp(arch, "gpt2"), permute = !strcmp(arch, "llama");
    const int D = a->head_dim ? a->head_dim : c->d_model / c->n_head;
    /* the tensors: names, shapes, types, offsets */
    ts = loom_calloc((size_t)nh + 1, sizeof *ts);
    uint64_t off = 0;
    for (int i = 0; i < nh; i++) {
        gtensor *t = &ts[nt++];
        if (gguf_name(hts[i].name, gpt2, t->name, sizeof t->name, &t->transpose, &t->qk)) {
            loom_errf(err, "%s: tensor '%s' has no GGUF name in llama.cpp's '%s'", ckpt,
                      hts[i].name, arch);
            goto done;
        }
        if (!permute) t->qk = 0;
        t->src = hts[i].data;
        t->ndim = hts[i].ndim;
        if (t->ndim == 1) t->rows = 1, t->cols = hts[i].shape[0];
        else if (t->transpose) t->rows = hts[i].shape[1], t->cols = hts[i].shape[0];
        else t->rows = hts[i].shape[0], t->cols = hts[i].shape[1];
        /* 1-D tensors (norms, biases) stay f32, as llama.cpp's converter keeps them; q8_0
         * needs rows of whole blocks (else f32). q4_k: the matrices --weights int4 holds in
         * Q4_K (rows of whole 256-blocks), the others and the embedding / head in Q8_0 as
         * --weights int4 holds them (llama.cpp's Q4_K mixes keep the head in more bits too) */
        t->type = t->ndim == 1 ? GGML_F32 : want;
        if (t->type == GGML_Q4_K && (t->cols % LOOM_Q4K_BLOCK || !strcmp(t->name, "token_embd.weight") ||
                                     !strcmp(t->name, "output.weight")))
            t->type = GGML_Q8_0;
        if (t->type == GGML_Q8_0 && t->cols % 32) t->type = GGML_F32;
        t->bytes = type_bytes(t->type, t->rows * t->cols);
        t->off = off;
        off = (off + t->bytes + GGUF_ALIGN - 1) / GGUF_ALIGN * GGUF_ALIGN;
        if (gpt2 && !strcmp(t->name, "token_embd.weight")) { /* the converter's output copy */
            ts[nt] = *t;
            snprintf(ts[nt].name, sizeof ts[nt].name, "output.weight");
            ts[nt].off = off;
            off = (off + t->bytes + GGUF_ALIGN - 1) / GGUF_ALIGN * GGUF_ALIGN;
            nt++;
        }
    }
    /* the metadata */
    char key[128];
#define AK(s) (snprintf(key, sizeof key, "%s." s, arch), key)
    kv_str(&kv, "general.architecture", arch);
    kv_str(&kv, "general.name", "loom");
    kv_u32(&kv, "general.alignment", GGUF_ALIGN);
    /* llama.cpp's llama_ftype: MOSTLY_Q8_0 7, MOSTLY_Q4_K_S 14, MOSTLY_BF16 32, ALL_F32 0 */
    kv_u32(&kv, "general.file_type",
           want == GGML_Q8_0 ? 7 : want == GGML_Q4_K ? 14 : want == GGML_BF16 ? 32 : 0);
    kv_u32(&kv, "general.quantization_version", 2);
    kv_u32(&kv, AK("context_length"), (uint32_t)c->max_seq_len);
    kv_u32(&kv, AK("embedding_length"), (uint32_t)c->d_model);
    kv_u32(&kv, AK("block_count"), (uint32_t)c->n_layer);
    kv_u32(&kv, AK("feed_forward_length"), (uint32_t)c->d_ff);
    kv_u32(&kv, AK("attention.head_count"), (uint32_t)c->n_head);
    if (gpt2) {
        kv_f32(&kv, AK("attention.layer_norm_epsilon"), c->norm_eps);
    } else {
        kv_u32(&kv, AK("attention.head_count_kv"), (uint32_t)c->n_kv_head);
        kv_f32(&kv, AK("rope.freq_base"), c->rope_theta);
        kv_f32(&kv, AK("attention.layer_norm_rms_epsilon"), c->norm_eps);
        kv_u32(&kv, AK("rope.dimension_count"), (uint32_t)D);
        if (D * c->n_head != c->d_model) {
            kv_u32(&kv, AK("attention.key_length"), (uint32_t)D);
            kv_u32(&kv, AK("attention.value_length"), (uint32_t)D);
        }
    }
    kv_u32(&kv, AK("vocab_size"), (uint32_t)c->vocab_size);
#undef AK
    if (rd->chat_template) {
        if (loom_chat_template_load(rd->chat_template, &tpl, err)) {
            loom_err_prefix(err, "%s", ckpt);
            goto done;
        }
        if (rd->chat_default_system && !tpl->default_system)
            tpl->default_system = loom_strdup(rd->chat_default_system);
        jinja = loom_chat_template_jinja(tpl);
    }
    if (loom_run_data_tokenizer(rd, &tok, err) || put_tokenizer(&kv, tok, c->vocab_size, jinja, err)) {
        loom_err_prefix(err, "%s", ckpt);
        goto done;
    }
    for (int i = 0; i < nt; i++) {
        const gtensor *t = &ts[i];
        put_str(&info, t->name);
        put_u32(&info, (uint32_t)t->ndim);
        put_u64(&info, (uint64_t)t->cols); /* ne[0]: the innermost dimension */
        if (t->ndim == 2) put_u64(&info, (uint64_t)t->rows);
        put_u32(&info, (uint32_t)t->type);
        put_u64(&info, t->off);
    }
    /* the file: header, metadata, infos, padding, data */
    if (loom_path_fmt(tmp, sizeof tmp, err, "%s.tmp.%ld", out, (long)getpid())) goto done;
    f = fopen(tmp, "wb");
    if (!f) {
        loom_errf(err, "%s: cannot create: %s", out, strerror(errno));
        goto done;
    }
    gbuf h = {0};
    put(&h, "GGUF", 4);
    put_u32(&h, 3);
    put_u64(&h, (uint64_t)nt);
    put_u64(&h, kv.n);
    int bad = write_all(f, h.p, h.n) || write_all(f, kv.b.p, kv.b.n) || write_all(f, info.p, info.n);
    uint64_t pos = h.n + kv.b.n + info.n;
    free(h.p);
    static const char zeros[GGUF_ALIGN] = {0};
    const uint64_t pad0 = (GGUF_ALIGN - pos % GGUF_ALIGN) % GGUF_ALIGN;
    bad |= write_all(f, zeros, pad0);
    int64_t maxc = 0;
    for (int i = 0; i < nt; i++) maxc = ts[i].cols > maxc ? ts[i].cols : maxc;
    row = loom_alloc_aligned((size_t)maxc * sizeof(float));
    packed = loom_alloc_aligned((size_t)maxc * 4 + 64);
    const loom_backend *be = loom_backend_cpu(); /* its Q8_0 quantizer: --weights int8's */
    uint64_t at = 0;
    for (int i = 0; i < nt && !bad; i++) {
        const gtensor *t = &ts[i];
        bad |= write_all(f, zeros, t->off - at);
        for (int64_t r = 0; r < t->rows && !bad; r++) {
            gguf_row(t, r, D, row);
            size_t n = 0;
            if (t->type == GGML_F32) {
                memcpy(packed, row, (size_t)t->cols * 4);
                n = (size_t)t->cols * 4;
            } else if (t->type == GGML_BF16) {
                uint16_t *p = packed;
                for (int64_t j = 0; j < t->cols; j++) p[j] = loom_bf16_round(row[j]);
                n = (size_t)t->cols * 2;
            } else if (t->type == GGML_Q4_K) { /* --weights int4's quantizer, GGUF's blocks */
                be->q4k_quantize(packed, row, 1, (int)t->cols);
                n = (size_t)(t->cols / LOOM_Q4K_BLOCK) * LOOM_Q4K_BYTES;
            } else { /* Q8_0 blocks: fp16 scale, 32 int8 (loom's own quantizer) */
                int8_t q[32];
                uint16_t d;
                char *p = packed;
                for (int64_t b = 0; b < t->cols / 32; b++) {
                    be->q8_quantize(q, &d, row + b * 32, 1, 32);
                    memcpy(p + b * 34, &d, 2);
                    memcpy(p + b * 34 + 2, q, 32);
                }
                n = (size_t)(t->cols / 32) * 34;
            }
            bad |= write_all(f, packed, n);
        }
        at = t->off + t->bytes;
    }
    if (bad || fflush(f) != 0 || fsync(fileno(f)) != 0) {
        loom_errf(err, "%s: write failed: %s", tmp, strerror(errno));
        goto done;
    }
    if (fclose(f) != 0) {
        f = NULL;
        loom_errf(err, "%s: write failed: %s", tmp, strerror(errno));
        goto done;
    }
    f = NULL;
    if (rename(tmp, out) != 0) {
        loom_errf(err, "%s: cannot rename %s onto it: %s", out, tmp, strerror(errno));
        goto done;
    }
    tmp[0] = 0;
    rc = 0;
done:
    if (f) fclose(f);
    if (tmp[0]) unlink(tmp);
    free(row);
    free(packed);
    free(kv.b.p);
    free(info.p);
    free(ts);
    free(jinja);
    loom_chat_template_free(tpl);
    loom_tokenizer_free(tok);
    loom_hf_tensors_free(hts, nh);
    loom_run_data_free(rd);
    loom_config_free(cfg);
    loom_model_free(m);
    return rc;
}
