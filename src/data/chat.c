/* Chat templates and the rendering of OpenAI-format conversations with a loss mask. */
#include "loom/chat.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json_util.h"

static const char *const ROLE_NAMES[LOOM_ROLE_COUNT] = {"system", "user", "assistant", "tool"};

void loom_chat_template_free(loom_chat_template *t) {
    if (!t) return;
    free(t->name);
    free(t->bos);
    for (int r = 0; r < LOOM_ROLE_COUNT; r++) {
        free(t->pre[r]);
        free(t->post[r]);
    }
    free(t->call_pre);
    free(t->call_post);
    free(t->call_sep);
    free(t->args_key);
    free(t->default_system);
    free(t->system_prefix);
    free(t->tool_open);
    free(t->tool_close);
    free(t->system_fold);
    free(t->tools_block);
    free(t);
}

/* How the tool definitions are described. Hermes-style (chatml, qwen): the format Qwen 2.5's
 * and Qwen 3's templates write into the system message, so a Qwen model sees its tools as it
 * was trained to; loom's own for plain and llama3 (whose call is the JSON alone). */
static const char HERMES_TOOLS[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
    "provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n"
    "</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\n</tool_call>";

static char *own_tools_block(const char *args_key) {
    loom_sbuf b = {0};
    loom_sbuf_printf(&b, "# Tools\n\nThe functions you can call, one JSON definition per line:\n"
                         "{tools}\nTo call one, answer with {\"name\": <its name>, \"%s\": <a JSON "
                         "object of its parameters>} and nothing else.", args_key);
    return b.p;
}

/* splits "a{content}b" into a and b; -1 unless {content} occurs exactly once */
static int split_content(const char *s, char **pre, char **post) {
    const char *p = strstr(s, "{content}");
    if (!p || strstr(p + 9, "{content}")) return -1;
    *pre = loom_malloc((size_t)(p - s) + 1);
    memcpy(*pre, s, (size_t)(p - s));
    (*pre)[p - s] = 0;
    *post = loom_strdup(p + 9);
    return 0;
}

static loom_chat_template *from_strings(const char *name, const char *bos, const char *const roles[4],
                                        const char *call, const char *sep, const char *args) {
    loom_chat_template *t = loom_calloc(1, sizeof *t);
    t->name = loom_strdup(name);
    t->bos = loom_strdup(bos);
    for (int r = 0; r < LOOM_ROLE_COUNT; r++) LOOM_CHECK(split_content(roles[r], &t->pre[r], &t->post[r]) == 0);
    LOOM_CHECK(split_content(call, &t->call_pre, &t->call_post) == 0);
    t->call_sep = loom_strdup(sep);
    t->args_key = loom_strdup(args);
    t->roles = (1u << LOOM_ROLE_COUNT) - 1;
    t->tools = 1;
    return t;
}

int loom_chat_template_is_builtin(const char *name) {
    static const char *const names[] = {"plain", "chatml", "qwen", "llama3", "llama3.1", "mistral", "gemma", "gemma3"};
    for (int i = 0; i < 8; i++)
        if (!strcmp(name, names[i])) return 1;
    return 0;
}

/* Jinja source spells a newline inside a string literal as \n (two characters) or as itself */
static int has_marker(const char *s, size_t n, const char *m) {
    size_t ml = strlen(m);
    if (ml > n) return 0;
    for (size_t i = 0; i + ml <= n; i++)
        if (s[i] == m[0] && !memcmp(s + i, m, ml)) return 1;
    return 0;
}

/* s with each "\n" spelled as a newline: the two spellings compare alike */
static char *unescape_newlines(const char *s, size_t n) {
    char *o = loom_malloc(n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\\' && i + 1 < n && s[i + 1] == 'n') {
            o[k++] = '\n';
            i++;
        } else {
            o[k++] = s[i];
        }
    }
    o[k] = 0;
    return o;
}

/* ---- a template as Jinja (export) ---------------------------------------------------------- */

/* s as a Jinja string literal: JSON's escapes (\n, \", \\, \uXXXX), which Jinja's lexer
 * reads back to the same text */
static void jlit(loom_sbuf *b, const char *s) {
    json_t *j = json_string(s);
    LOOM_CHECK(j != NULL);
    char *t = json_dumps(j, JSON_ENCODE_ANY);
    json_decref(j);
    LOOM_CHECK(t != NULL);
    loom_sbuf_printf(b, "%s", t);
    free(t);
}

/* {{ "s" }} when s is not empty */
static void jout(loom_sbuf *b, const char *s) {
    if (!s || !*s) return;
    loom_sbuf_printf(b, "{{ ");
    jlit(b, s);
    loom_sbuf_printf(b, " }}");
}

/* The marker a generated template starts with; loom_chat_template_detect reads it back */
#define JINJA_MARK "{#- loom chat template -#}{%- set loom_template = "

char *loom_chat_template_jinja(const loom_chat_template *t) {
    loom_sbuf b = {0};
    /* no text between tags: the rendering holds only what the tags print */
    loom_sbuf_printf(&b, "%s", JINJA_MARK);
    jlit(&b, t->name);
    loom_sbuf_printf(&b, " -%%}");
    if (t->default_system) {
        loom_sbuf_printf(&b, "{%%- set loom_default_system = ");
        jlit(&b, t->default_system);
        loom_sbuf_printf(&b, " -%%}");
    }
    /* a message's content as text: a string, or its text parts joined */
    loom_sbuf_printf(&b, "{%%- macro loom_text(c) -%%}{%%- if c is string -%%}{{ c }}{%%- elif c "
                         "-%%}{%%- for p in c -%%}{{ p['text'] }}{%%- endfor -%%}{%%- endif -%%}"
                         "{%%- endmacro -%%}");
    jout(&b, t->bos);
    /* tools (apply_chat_template(..., tools=...)): the system message that describes them, as
     * render_tools_system writes it; a leading system message is then not rendered again */
    const char *tb = t->tools_block ? strstr(t->tools_block, "{tools}") : NULL;
    loom_sbuf_printf(&b, "{%%- set loom_msgs = messages -%%}");
    if (tb) {
        loom_sbuf_printf(&b, "{%%- if tools -%%}");
        jout(&b, t->pre[LOOM_ROLE_SYSTEM]);
        jout(&b, t->system_prefix);
        loom_sbuf_printf(&b, "{%%- if messages[0]['role'] == 'system' -%%}{%%- set loom_msgs = "
                             "messages[1:] -%%}{{ loom_text(messages[0]['content']) + '\\n\\n' }}");
        if (t->default_system) loom_sbuf_printf(&b, "{%%- else -%%}{{ loom_default_system + '\\n\\n' }}");
        loom_sbuf_printf(&b, "{%%- endif -%%}");
        char *before = loom_malloc((size_t)(tb - t->tools_block) + 1);
        memcpy(before, t->tools_block, (size_t)(tb - t->tools_block));
        before[tb - t->tools_block] = 0;
        jout(&b, before);
        free(before);
        loom_sbuf_printf(&b, "{%%- for tool in tools -%%}{%%- if not loop.first -%%}{{ '\\n' }}"
                             "{%%- endif -%%}{{ tool | tojson }}{%%- endfor -%%}");
        jout(&b, tb + 7);
        jout(&b, t->post[LOOM_ROLE_SYSTEM]);

    } else if (t->tools) { /* no tools block: the tools are not described */
        loom_sbuf_printf(&b, "{%%- if false -%%}");
    } else {
        loom_sbuf_printf(&b, "{%%- if tools -%%}{{ raise_exception('the template has no tool-call format') }}");
    }
    if (t->default_system || t->always_system) {
        loom_sbuf_printf(&b, "{%%- elif messages[0]['role'] != 'system' -%%}");
        jout(&b, t->pre[LOOM_ROLE_SYSTEM]);
        jout(&b, t->system_prefix);
        if (t->default_system) loom_sbuf_printf(&b, "{{ loom_default_system }}");
        jout(&b, t->post[LOOM_ROLE_SYSTEM]);
    }
    loom_sbuf_printf(&b, "{%%- endif -%%}");
    loom_sbuf_printf(&b, "{%%- set ns = namespace(fold='') -%%}{%%- for message in loom_msgs -%%}");
    loom_sbuf_printf(&b, "{%%- set role = message['role'] -%%}{%%- if role not in [");
    for (int r = 0, first = 1; r < LOOM_ROLE_COUNT; r++)
        if (t->roles & (1u << r)) {
            loom_sbuf_printf(&b, "%s'%s'", first ? "" : ", ", ROLE_NAMES[r]);
            first = 0;
        }
    loom_sbuf_printf(&b, "] -%%}{{ raise_exception('the template has no ' + role + ' role') }}"
                         "{%%- endif -%%}");
    if (!t->tools)
        loom_sbuf_printf(&b, "{%%- if message['tool_calls'] -%%}{{ raise_exception('the template "
                             "has no tool-call format') }}{%%- endif -%%}");
    if (t->system_fold) { /* a leading system message opens the first user turn */
        loom_sbuf_printf(&b, "{%%- if role == 'system' -%%}{%%- if not loop.first or "
                             "loop.length < 2 or messages[1]['role'] != 'user' -%%}"
                             "{{ raise_exception('a system message only first and before a user "
                             "message') }}{%%- endif -%%}{%%- set ns.fold = loom_text(message['content']) + ");
        jlit(&b, t->system_fold);
        loom_sbuf_printf(&b, " -%%}{%%- else -%%}");
    }
    if (t->tool_open) {
        loom_sbuf_printf(&b, "{%%- if role == 'tool' and (loop.first or loop.previtem['role'] != "
                             "'tool') -%%}");
        jout(&b, t->tool_open);
        loom_sbuf_printf(&b, "{%%- endif -%%}");
    }
    for (int r = 0, first = 1; r < LOOM_ROLE_COUNT; r++) {
        if (!(t->roles & (1u << r))) continue;
        loom_sbuf_printf(&b, "{%%- %sif role == '%s' -%%}", first ? "" : "el", ROLE_NAMES[r]);
        first = 0;
        jout(&b, t->pre[r]);
        if (t->system_fold) loom_sbuf_printf(&b, "{%%- if loop.index0 == 1 -%%}{{ ns.fold }}{%%- endif -%%}");
        if (r == LOOM_ROLE_SYSTEM && t->system_prefix) {
            loom_sbuf_printf(&b, "{%%- if loop.first -%%}");
            jout(&b, t->system_prefix);
            loom_sbuf_printf(&b, "{%%- endif -%%}");
        }
        loom_sbuf_printf(&b, "{{ loom_text(message['content']) }}");
        if (r == LOOM_ROLE_ASSISTANT && t->tools) { /* {"name": ..., ARGS: {...}} per call */
            loom_sbuf_printf(&b, "{%%- set after = loom_text(message['content']) != '' -%%}"
                                 "{%%- for call in message['tool_calls'] or [] -%%}"
                                 "{%%- if not loop.first or after -%%}");
            jout(&b, t->call_sep);
            loom_sbuf_printf(&b, "{%%- endif -%%}");
            jout(&b, t->call_pre);
            loom_sbuf_printf(&b, "{{ '{\"name\": ' + call['function']['name'] | tojson + ', ' }}{{ ");
            jlit(&b, t->args_key);
            loom_sbuf_printf(&b, " | tojson + ': ' }}{%%- set a = call['function']['arguments'] -%%}"
                                 "{%%- if a is string -%%}{{ a }}{%%- elif a is mapping -%%}"
                                 "{{ a | tojson }}{%%- else -%%}{{ '{}' }}{%%- endif -%%}{{ '}' }}");
            jout(&b, t->call_post);
            loom_sbuf_printf(&b, "{%%- endfor -%%}");
        }
        jout(&b, t->post[r]);
    }
    loom_sbuf_printf(&b, "{%%- endif -%%}");
    if (t->tool_close) {
        loom_sbuf_printf(&b, "{%%- if role == 'tool' and (loop.last or loop.nextitem['role'] != "
                             "'tool') -%%}");
        jout(&b, t->tool_close);
        loom_sbuf_printf(&b, "{%%- endif -%%}");
    }
    if (t->system_fold) loom_sbuf_printf(&b, "{%%- endif -%%}");
    loom_sbuf_printf(&b, "{%%- endfor -%%}{%%- if add_generation_prompt -%%}");
    jout(&b, t->pre[LOOM_ROLE_ASSISTANT]);
    loom_sbuf_printf(&b, "{%%- endif -%%}");
    return b.p ? b.p : loom_strdup("");
}

/* A template loom_chat_template_jinja wrote: its name (a built-in) and default system message */
static const char *detect_own(const char *jinja, size_t len, char **default_system) {
    const size_t ml = strlen(JINJA_MARK);
    if (len < ml || memcmp(jinja, JINJA_MARK, ml) != 0) return NULL;
    json_error_t je;
    size_t used = 0;
    /* the literals are JSON strings: the name, then (optionally) the default system message */
    json_t *name = json_loadb(jinja + ml, len - ml, JSON_DECODE_ANY | JSON_DISABLE_EOF_CHECK, &je);
    if (!json_is_string(name)) {
        json_decref(name);
        return NULL;
    }
    used = (size_t)je.position;
    static const char *const names[] = {"plain", "chatml", "qwen", "llama3", "llama3.1", "mistral", "gemma", "gemma3"};
    const char *found = NULL;
    for (int i = 0; i < 8; i++)
        if (!strcmp(json_string_value(name), names[i])) found = names[i];
    json_decref(name);
    if (!found) return NULL;
    const char *ds = "{%- set loom_default_system = ";
    const char *p = strstr(jinja + ml + used, ds);
    if (p && (size_t)(p - jinja) < len) {
        json_t *v = json_loadb(p + strlen(ds), len - (size_t)(p + strlen(ds) - jinja),
                               JSON_DECODE_ANY | JSON_DISABLE_EOF_CHECK, &je);
        if (json_is_string(v)) *default_system = loom_strdup(json_string_value(v));
        json_decref(v);
    }
    return found;
}

const char *loom_chat_template_detect(const char *jinja, size_t len, char **default_system, const char **why) {
    *default_system = NULL;
    *why = NULL;
    const char *own = detect_own(jinja, len, default_system);
    if (own) return own;
    char *j = unescape_newlines(jinja, len);
    const size_t n = strlen(j);
    const char *name = NULL;
    if (has_marker(j, n, "<|im_start|>") && has_marker(j, n, "<|im_end|>")) {
        if (!has_marker(j, n, "<|im_end|>\n") || !has_marker(j, n, "<|im_start|>assistant\n"))
            *why = "it uses chatml's markers but not chatml's '<|im_start|>ROLE\\n' ... '<|im_end|>\\n' layout";
        else if (has_marker(j, n, "<think>"))
            *why = "it writes <think> reasoning blocks (Qwen 3), which loom's templates do not: name qwen or chatml "
                   "to render without them";
        else if (has_marker(j, n, "<tool_response>") &&
                 (!has_marker(j, n, "'<|im_start|>user'") || !has_marker(j, n, "'\n<tool_response>\n'") ||
                  !has_marker(j, n, "'\n</tool_response>'")))
            *why = "it writes tool results in <tool_response> but not as Qwen 2.5/3's templates do";
        else
            name = has_marker(j, n, "<tool_response>") ? "qwen" : "chatml";
        /* Qwen: a fixed system message when the conversation has none */
        const char *tag = "<|im_start|>system\n";
        for (const char *p = strstr(j, tag); name && p; p = strstr(p + 1, tag)) {
            const char *a = p + strlen(tag), *e = strstr(a, "<|im_end|>");
            if (!e || e == a) continue;
            size_t l = (size_t)(e - a);
            if (memchr(a, '\'', l) || memchr(a, '"', l) || memchr(a, '{', l) || memchr(a, '}', l) ||
                memchr(a, '\\', l) || memchr(a, '+', l))
                continue; /* not one literal */
            *default_system = loom_malloc(l + 1);
            memcpy(*default_system, a, l);
            (*default_system)[l] = 0;
            break;
        }
    } else if (has_marker(j, n, "<|start_header_id|>") && has_marker(j, n, "<|eot_id|>")) {
        if (has_marker(j, n, "Cutting Knowledge Date")) {
            if (has_marker(j, n, "strftime_now"))
                *why = "it is Llama 3.2/3.3's template, whose system header holds today's date (strftime_now), "
                       "which would make the rendering depend on the day; name llama3.1 (dated 26 Jul 2024) or llama3";
            else if ((!has_marker(j, n, "\"26 Jul 2024\"") && !has_marker(j, n, "'26 Jul 2024'")) || !has_marker(j, n, "Cutting Knowledge Date: December 2023\n") ||
                     !has_marker(j, n, "Today Date: "))
                *why = "it is a Llama 3.1-style template with another date or header than loom's llama3.1";
            else
                name = "llama3.1";
        } else if (!has_marker(j, n, "<|end_header_id|>\n\n"))
            *why = "it uses Llama 3's markers but not its '<|end_header_id|>\\n\\n' layout";
        else
            name = "llama3";
    } else if (has_marker(j, n, "[INST]") && has_marker(j, n, "[/INST]")) {
        if (!has_marker(j, n, "'[INST] '") || !has_marker(j, n, "' [/INST]'"))
            *why = "it uses Mistral's [INST] markers but not the '[INST] ' ... ' [/INST]' spacing of loom's mistral";
        else
            name = "mistral";
    } else if (has_marker(j, n, "<start_of_turn>") && has_marker(j, n, "<end_of_turn>")) {
        if (!has_marker(j, n, "<end_of_turn>\n") || !has_marker(j, n, "model"))
            *why = "it uses Gemma's turn markers but not its '<start_of_turn>ROLE\\n' ... '<end_of_turn>\\n' layout";
        else if (has_marker(j, n, "first_user_prefix") && !has_marker(j, n, "['content'] + '\n\n'"))
            *why = "it folds the system message into the first user turn, but not with Gemma 3's '\\n\\n'";
        else
            name = has_marker(j, n, "first_user_prefix") ? "gemma3" : "gemma";
    } else {
        *why = "it has none of the markers of chatml (<|im_start|>), llama3 (<|start_header_id|>), mistral ([INST]) "
               "or gemma (<start_of_turn>)";
    }
    free(j);
    if (!name) {
        free(*default_system);
        *default_system = NULL;
    }
    return name;
}

void loom_chat_template_from_hf_dir(const char *dir, char **name, char **default_system) {
    *name = NULL;
    *default_system = NULL;
    size_t n = strlen(dir) + sizeof "/tokenizer_config.json";
    char *path = loom_malloc(n);
    snprintf(path, n, "%s/tokenizer_config.json", dir);
    const char *nm;
    loom_err err;
    if (loom_path_exists(path) && loom_chat_template_detect_file(path, &nm, default_system, &err) == 0)
        *name = loom_strdup(nm);
    free(path);
}

int loom_chat_template_detect_file(const char *path, const char **name, char **default_system, loom_err *err) {
    json_t *root = NULL;
    *name = NULL;
    *default_system = NULL;
    if (loom_json_object_file(path, (size_t)64 << 20, &root, err)) return -1;
    json_t *ct = json_object_get(root, "chat_template");
    if (json_is_array(ct)) { /* named templates: the default one */
        size_t i;
        json_t *x, *found = NULL;
        json_array_foreach(ct, i, x) {
            const char *nm = json_string_value(json_object_get(x, "name"));
            if (nm && !strcmp(nm, "default")) found = json_object_get(x, "template");
        }
        ct = found;
    }
    if (!json_is_string(ct)) {
        json_decref(root);
        return loom_errf(err, "%s: no chat_template (a string, or a list with a \"default\" entry); name the chat "
                              "template instead: chatml, llama3, mistral, gemma, plain or a JSON template file", path);
    }
    const char *why;
    *name = loom_chat_template_detect(json_string_value(ct), json_string_length(ct), default_system, &why);
    json_decref(root);
    if (!*name)
        return loom_errf(err, "%s: chat_template is not one loom recognizes: %s (loom matches templates by their "
                              "markers and never runs Jinja); name the chat template instead: chatml, llama3, "
                              "mistral, gemma, plain or a JSON template file", path, why);
    return 0;
}

int loom_chat_template_load(const char *spec, loom_chat_template **out, loom_err *err) {
    if (!strcmp(spec, "plain")) { /* no special tokens: for models trained on plain text */
        static const char *const roles[4] = {"system: {content}\n", "user: {content}\n",
                                             "assistant: {content}\n", "tool: {content}\n"};
        *out = from_strings("plain", "", roles, "{content}", "\n", "arguments");
        (*out)->tools_block = own_tools_block("arguments");
        return 0;
    }
    if (!strcmp(spec, "chatml")) {
        static const char *const roles[4] = {
            "<|im_start|>system\n{content}<|im_end|>\n", "<|im_start|>user\n{content}<|im_end|>\n",
            "<|im_start|>assistant\n{content}<|im_end|>\n", "<|im_start|>tool\n{content}<|im_end|>\n"};
        *out = from_strings("chatml", "", roles, "<tool_call>\n{content}\n</tool_call>", "\n",
                            "arguments");
        (*out)->tools_block = loom_strdup(HERMES_TOOLS);
        return 0;
    }
    if (!strcmp(spec, "llama3")) {
        static const char *const roles[4] = {
            "<|start_header_id|>system<|end_header_id|>\n\n{content}<|eot_id|>",
            "<|start_header_id|>user<|end_header_id|>\n\n{content}<|eot_id|>",
            "<|start_header_id|>assistant<|end_header_id|>\n\n{content}<|eot_id|>",
            "<|start_header_id|>ipython<|end_header_id|>\n\n{content}<|eot_id|>"};
        *out = from_strings("llama3", "<|begin_of_text|>", roles, "{content}", "\n", "parameters");
        (*out)->tools_block = own_tools_block("parameters");
        return 0;
    }
    if (!strcmp(spec, "qwen")) { /* chatml, tool results as Qwen 2.5/3 write them: in a user turn */
        if (loom_chat_template_load("chatml", out, err)) return -1;
        loom_chat_template *q = *out;
        free(q->name);
        q->name = loom_strdup("qwen");
        free(q->pre[LOOM_ROLE_TOOL]);
        free(q->post[LOOM_ROLE_TOOL]);
        q->pre[LOOM_ROLE_TOOL] = loom_strdup("\n<tool_response>\n");
        q->post[LOOM_ROLE_TOOL] = loom_strdup("\n</tool_response>");
        q->tool_open = loom_strdup("<|im_start|>user");
        q->tool_close = loom_strdup("<|im_end|>\n");
        return 0;
    }
    if (!strcmp(spec, "llama3.1")) { /* Llama 3.1's: a system header always, dated as its template's default */
        if (loom_chat_template_load("llama3", out, err)) return -1;
        free((*out)->name);
        (*out)->name = loom_strdup("llama3.1");
        (*out)->system_prefix = loom_strdup("Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n");
        (*out)->always_system = 1;
        return 0;
    }
    if (!strcmp(spec, "gemma3")) { /* Gemma 3: a system message opens the first user turn */
        if (loom_chat_template_load("gemma", out, err)) return -1;
        free((*out)->name);
        (*out)->name = loom_strdup("gemma3");
        (*out)->system_fold = loom_strdup("\n\n");
        (*out)->roles |= 1u << LOOM_ROLE_SYSTEM;
        return 0;
    }
    if (!strcmp(spec, "mistral")) { /* Mistral-7B-Instruct v0.1/v0.2's template: user and assistant only */
        static const char *const roles[4] = {"{content}", "[INST] {content} [/INST]", "{content}</s>", "{content}"};
        *out = from_strings("mistral", "<s>", roles, "{content}", "\n", "arguments");
        (*out)->roles = 1u << LOOM_ROLE_USER | 1u << LOOM_ROLE_ASSISTANT;
        (*out)->tools = 0;
        return 0;
    }
    if (!strcmp(spec, "gemma")) { /* Gemma's turns (the assistant is "model"): user and assistant only */
        static const char *const roles[4] = {"{content}", "<start_of_turn>user\n{content}<end_of_turn>\n",
                                             "<start_of_turn>model\n{content}<end_of_turn>\n", "{content}"};
        *out = from_strings("gemma", "<bos>", roles, "{content}", "\n", "arguments");
        (*out)->roles = 1u << LOOM_ROLE_USER | 1u << LOOM_ROLE_ASSISTANT;
        (*out)->tools = 0;
        return 0;
    }
    char *buf;
    size_t len;
    if (loom_read_file(spec, (size_t)1 << 20, &buf, &len, err))
        return loom_err_prefix(err, "chat template (plain, chatml, llama3 or a JSON file)");
    json_error_t je;
    json_t *o = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    free(buf);
    if (!json_is_object(o)) {
        json_decref(o);
        return loom_errf(err, "%s: chat template: %s", spec, o ? "not a JSON object" : je.text);
    }
    const char *base = strrchr(spec, '/');
    base = base ? base + 1 : spec;
    if (json_object_get(o, "chat_template") || !strcmp(base, "tokenizer_config.json")) {
        /* a Hugging Face tokenizer_config.json: the built-in its chat_template renders like */
        json_decref(o);
        const char *name;
        char *dsys;
        if (loom_chat_template_detect_file(spec, &name, &dsys, err)) return -1;
        if (loom_chat_template_load(name, out, err)) {
            free(dsys);
            return -1;
        }
        (*out)->default_system = dsys;
        return 0;
    }
    static const char *const keys[] = {"bos", "system", "user", "assistant", "tool", "tool_call",
                                       "tool_call_separator", "arguments_key", "tools"};
    const char *v[9];
    const char *k;
    json_t *val;
    json_object_foreach(o, k, val) {
        int known = 0;
        for (int i = 0; i < 9; i++) known |= !strcmp(k, keys[i]);
        if (!known) {
            loom_errf(err, "%s: unknown key '%s' (known: bos, system, user, assistant, tool, "
                           "tool_call, tool_call_separator, arguments_key, tools)", spec, k);
            json_decref(o);
            return -1;
        }
    }
    static const char *const dflt[] = {"", NULL, NULL, NULL, NULL, "{content}", "\n", "arguments", ""};
    for (int i = 0; i < 9; i++) {
        json_t *x = json_object_get(o, keys[i]);
        v[i] = x ? json_string_value(x) : dflt[i];
        if (!v[i] || (x && strlen(v[i]) != json_string_length(x))) {
            loom_errf(err, "%s: '%s' %s", spec, keys[i],
                      x ? "must be a string without NUL characters" : "is missing");
            json_decref(o);
            return -1;
        }
        if (i >= 1 && i <= 5) {
            const char *p = strstr(v[i], "{content}");
            if (!p || strstr(p + 9, "{content}")) {
                loom_errf(err, "%s: '%s' must hold {content} exactly once", spec, keys[i]);
                json_decref(o);
                return -1;
            }
        }
        if (i == 8 && x) {
            const char *p = strstr(v[i], "{tools}");
            if (!p || strstr(p + 7, "{tools}")) {
                loom_errf(err, "%s: 'tools' must hold {tools} exactly once", spec);
                json_decref(o);
                return -1;
            }
        }
    }
    *out = from_strings(spec, v[0], v + 1, v[5], v[6], v[7]);
    if (v[8][0]) (*out)->tools_block = loom_strdup(v[8]);
    json_decref(o);
    return 0;
}

/* ---- rendering ------------------------------------------------------------------------ */
void loom_chat_doc_free(loom_chat_doc *d) {
    free(d->text);
    free(d->seg);
    memset(d, 0, sizeof *d);
}

static void put(loom_chat_doc *d, const char *s, size_t n, int train) {
    if (n == 0) return;
    if (d->len + n + 1 > d->cap) {
        d->cap = (d->len + n + 1) * 2;
        d->text = loom_realloc(d->text, d->cap);
    }
    memcpy(d->text + d->len, s, n);
    d->len += n;
    d->text[d->len] = 0;
    if (d->n_seg && d->seg[d->n_seg - 1].train == train) { /* extend the last segment */
        d->seg[d->n_seg - 1].end = d->len;
        return;
    }
    if (d->n_seg == d->cap_seg) {
        d->cap_seg = d->cap_seg ? 2 * d->cap_seg : 16;
        d->seg = loom_realloc(d->seg, d->cap_seg * sizeof *d->seg);
    }
    d->seg[d->n_seg++] = (loom_chat_seg){d->len, (uint8_t)train};
}

static void puts_(loom_chat_doc *d, const char *s, int train) { put(d, s, strlen(s), train); }

/* content: a string, or a list of {"type": "text", "text": ...} parts; null when allowed */
static int content_of(json_t *m, int k, int null_ok, loom_chat_doc *d, int train, char *why,
                      size_t ws) {
    json_t *c = json_object_get(m, "content");
    if (!c || json_is_null(c)) {
        if (null_ok) return 0;
        snprintf(why, ws, "message %d: no \"content\"", k);
        return -1;
    }
    if (json_is_string(c)) {
        put(d, json_string_value(c), json_string_length(c), train);
        return 0;
    }
    if (json_is_array(c)) {
        size_t i;
        json_t *part;
        json_array_foreach(c, i, part) {
            json_t *tx = json_object_get(part, "text");
            const char *type = json_string_value(json_object_get(part, "type"));
            if (!json_is_string(tx) || (type && strcmp(type, "text"))) {
                snprintf(why, ws, "message %d: content part %zu is not {\"type\": \"text\", \"text\": ...}", k, i);
                return -1;
            }
            put(d, json_string_value(tx), json_string_length(tx), train);
        }
        return 0;
    }
    snprintf(why, ws, "message %d: \"content\" must be a string, a list of text parts%s", k,
             null_ok ? " or null" : "");
    return -1;
}

static int tool_calls(const loom_chat_template *t, json_t *calls, int k, int after_content,
                      loom_chat_doc *d, char *why, size_t ws) {
    if (!json_is_array(calls)) {
        snprintf(why, ws, "message %d: \"tool_calls\" must be a list", k);
        return -1;
    }
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        json_t *fn = json_object_get(c, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        json_t *args = json_object_get(fn, "arguments"), *parsed = NULL;
        if (!json_is_object(fn) || !name || !*name) {
            snprintf(why, ws, "message %d: tool_calls[%zu] needs \"function\": {\"name\": ..., \"arguments\": ...}", k, i);
            return -1;
        }
        if (json_is_string(args)) { /* OpenAI: arguments is a JSON text */
            parsed = json_loadb(json_string_value(args), json_string_length(args),
                                JSON_REJECT_DUPLICATES, NULL);
            if (!json_is_object(parsed)) {
                json_decref(parsed);
                snprintf(why, ws, "message %d: tool_calls[%zu].function.arguments is not a JSON object", k, i);
                return -1;
            }
        } else if (json_is_object(args)) {
            parsed = json_incref(args);
        } else if (!args || json_is_null(args)) {
            parsed = json_object();
        } else {
            snprintf(why, ws, "message %d: tool_calls[%zu].function.arguments must be a JSON object or its text", k, i);
            return -1;
        }
        json_t *call = json_object();
        json_object_set_new(call, "name", json_string(name));
        json_object_set_new(call, t->args_key, parsed);
        char *js = json_dumps(call, JSON_PRESERVE_ORDER);
        json_decref(call);
        LOOM_CHECK(js != NULL);
        if (i > 0 || after_content) puts_(d, t->call_sep, 1);
        puts_(d, t->call_pre, 1);
        puts_(d, js, 1);
        puts_(d, t->call_post, 1);
        free(js);
    }
    return 0;
}

/* every message of a conversation into d; the number of assistant messages in *assistants */
/* the tools' JSON texts, one per line (the definitions as given, keys in their order) */
static int tools_text(json_t *tools, loom_sbuf *b, char *why, size_t ws) {
    size_t i;
    json_t *x;
    json_array_foreach(tools, i, x) {
        if (!json_is_object(x)) {
            snprintf(why, ws, "tools[%zu] is not a JSON object", i);
            return -1;
        }
        char *js = json_dumps(x, JSON_PRESERVE_ORDER);
        LOOM_CHECK(js != NULL);
        loom_sbuf_printf(b, "%s%s", i ? "\n" : "", js);
        free(js);
    }
    return 0;
}

/* The system message that describes the tools: the conversation's own system message (message
 * 0, whose content it takes: *took = 1), else the default system message, then a blank line
 * and the template's tools_block with {tools} filled in. */
static int render_tools_system(const loom_chat_template *t, json_t *messages, json_t *tools,
                               loom_chat_doc *d, int *took, char *why, size_t ws) {
    loom_sbuf list = {0};
    if (tools_text(tools, &list, why, ws)) {
        free(list.p);
        return -1;
    }
    json_t *m0 = json_array_get(messages, 0);
    const char *role0 = json_string_value(json_object_get(m0, "role"));
    loom_chat_doc sys = {0};
    *took = role0 && !strcmp(role0, "system");
    if (*took) {
        if (content_of(m0, 0, 0, &sys, 0, why, ws)) {
            free(list.p);
            loom_chat_doc_free(&sys);
            return -1;
        }
    } else if (t->default_system) {
        puts_(&sys, t->default_system, 0);
    }
    puts_(d, t->pre[LOOM_ROLE_SYSTEM], 0);
    if (t->system_prefix) puts_(d, t->system_prefix, 0);
    if (*took || t->default_system) { /* even an empty one, as Qwen's templates */
        put(d, sys.text, sys.len, 0);
        puts_(d, "\n\n", 0);
    }
    const char *at = strstr(t->tools_block, "{tools}");
    put(d, t->tools_block, (size_t)(at - t->tools_block), 0);
    if (list.len) put(d, list.p, list.len, 0);
    puts_(d, at + 7, 0);
    puts_(d, t->post[LOOM_ROLE_SYSTEM], 0);
    free(list.p);
    loom_chat_doc_free(&sys);
    return 0;
}

static int render_messages(const loom_chat_template *t, json_t *messages, json_t *tools,
                           loom_chat_doc *d, int *assistants_out, char *why, size_t ws) {
    if (!json_is_array(messages) || json_array_size(messages) == 0) {
        snprintf(why, ws, "\"messages\" must be a non-empty list");
        return -1;
    }
    if (json_is_null(tools)) tools = NULL;
    if (tools && !json_is_array(tools)) {
        snprintf(why, ws, "\"tools\" must be a list");
        return -1;
    }
    if (tools && !json_array_size(tools)) tools = NULL;
    if (tools && !t->tools) {
        snprintf(why, ws, "template '%s' has no tool-call format: it cannot take tools", t->name);
        return -1;
    }
    puts_(d, t->bos, 0);
    size_t k;
    json_t *m;
    int assistants = 0, skip0 = 0;
    const char *role0 = json_string_value(json_object_get(json_array_get(messages, 0), "role"));
    if (tools && t->tools_block) {
        /* (no template with a tools block folds its system message) */
        if (render_tools_system(t, messages, tools, d, &skip0, why, ws)) return -1;
    } else if ((t->default_system || t->always_system) && !(role0 && !strcmp(role0, "system"))) {
        puts_(d, t->pre[LOOM_ROLE_SYSTEM], 0);
        if (t->system_prefix) puts_(d, t->system_prefix, 0);
        if (t->default_system) puts_(d, t->default_system, 0);
        puts_(d, t->post[LOOM_ROLE_SYSTEM], 0);
    }
    loom_chat_doc fold = {0}; /* system_fold: the leading system message's content */
    json_array_foreach(messages, k, m) {
        if (k == 0 && skip0) continue; /* written with the tools */
        const char *role = json_string_value(json_object_get(m, "role"));
        int r = -1;
        for (int i = 0; role && i < LOOM_ROLE_COUNT; i++)
            if (!strcmp(role, ROLE_NAMES[i])) r = i;
        if (!json_is_object(m) || r < 0) {
            snprintf(why, ws, "message %zu: role '%.40s' is not system, user, assistant or tool", k,
                     role ? role : "(missing)");
            goto fail;
        }
        if (!(t->roles & (1u << r))) {
            snprintf(why, ws, "message %zu: template '%s' has no %s role (its Hugging Face template refuses it)", k,
                     t->name, ROLE_NAMES[r]);
            goto fail;
        }
        if (!t->tools && json_object_get(m, "tool_calls") && !json_is_null(json_object_get(m, "tool_calls"))) {
            snprintf(why, ws, "message %zu: template '%s' has no tool-call format", k, t->name);
            goto fail;
        }
        if (t->system_fold && r == LOOM_ROLE_SYSTEM) {
            const char *r1 = json_string_value(json_object_get(json_array_get(messages, 1), "role"));
            if (k != 0 || !r1 || strcmp(r1, "user")) {
                snprintf(why, ws, "message %zu: template '%s' takes a system message only first and before a user message", k,
                         t->name);
                goto fail;
            }
            if (content_of(m, (int)k, 0, &fold, 0, why, ws)) {
                goto fail;
            }
            put(&fold, t->system_fold, strlen(t->system_fold), 0);
            continue;
        }
        const char *prev = k ? json_string_value(json_object_get(json_array_get(messages, k - 1), "role")) : NULL;
        const char *next = json_string_value(json_object_get(json_array_get(messages, k + 1), "role"));
        if (r == LOOM_ROLE_TOOL && t->tool_open && !(prev && !strcmp(prev, "tool"))) puts_(d, t->tool_open, 0);
        puts_(d, t->pre[r], 0);
        if (k == 1 && fold.len) put(d, fold.text, fold.len, 0);
        if (r == LOOM_ROLE_SYSTEM && k == 0 && t->system_prefix) puts_(d, t->system_prefix, 0);
        if (r == LOOM_ROLE_ASSISTANT) {
            assistants++;
            json_t *calls = json_object_get(m, "tool_calls");
            const int has_calls = calls && !json_is_null(calls);
            size_t before = d->len;
            if (content_of(m, (int)k, has_calls, d, 1, why, ws)) goto fail;
            if (has_calls && tool_calls(t, calls, (int)k, d->len > before, d, why, ws)) goto fail;
            if (d->len == before) {
                snprintf(why, ws, "message %zu: an assistant message with no content and no tool calls", k);
                goto fail;
            }
        } else if (content_of(m, (int)k, 0, d, 0, why, ws)) {
            goto fail;
        }
        puts_(d, t->post[r], r == LOOM_ROLE_ASSISTANT);
        if (r == LOOM_ROLE_TOOL && t->tool_close && !(next && !strcmp(next, "tool"))) puts_(d, t->tool_close, 0);
    }
    loom_chat_doc_free(&fold);
    *assistants_out = assistants;
    return 0;
fail:
    loom_chat_doc_free(&fold);
    return -1;
}

int loom_chat_render(const loom_chat_template *t, json_t *messages, loom_chat_doc *d, char *why,
                     size_t ws) {
    return loom_chat_render_tools(t, messages, NULL, d, why, ws);
}

int loom_chat_render_tools(const loom_chat_template *t, json_t *messages, json_t *tools,
                           loom_chat_doc *d, char *why, size_t ws) {
    int assistants;
    if (render_messages(t, messages, tools, d, &assistants, why, ws)) return -1;
    if (!assistants) {
        snprintf(why, ws, "no assistant message (nothing to train on)");
        return -1;
    }
    return 0;
}

int loom_chat_encode(const loom_chat_doc *d, const loom_tokenizer *tok, loom_ids *ids,
                     uint8_t **mask, loom_err *err) {
    size_t start = 0;
    *mask = NULL;
    LOOM_CHECK(ids->n == 0);
    for (size_t s = 0; s < d->n_seg; s++) {
        const size_t before = ids->n;
        /* a segment that does not follow an added token continues the text: no start-of-split
         * prefix (Metaspace, Prepend, add_prefix_space) at its beginning, as when the whole text
         * is encoded; after an added token a split starts there anyway */
        const int cont = s && !(ids->n && loom_tokenizer_is_added(tok, ids->ids[ids->n - 1]));
        if (loom_tokenizer_encode_ex(tok, d->text + start, (size_t)d->seg[s].end - start, cont ? LOOM_TOK_CONTINUE : 0,
                                     ids, err)) {
            free(*mask);
            *mask = NULL;
            return -1;
        }
        *mask = loom_realloc(*mask, ids->n ? ids->n : 1);
        memset(*mask + before, d->seg[s].train, ids->n - before);
        start = (size_t)d->seg[s].end;
    }
    if (!*mask) *mask = loom_malloc(1);
    return 0;
}

/* the assistant's end-of-turn marker: its post text without trailing whitespace */
static char *end_of_turn(const loom_chat_template *t) {
    const char *post = t->post[LOOM_ROLE_ASSISTANT];
    size_t n = strlen(post);
    while (n > 0 && (post[n - 1] == '\n' || post[n - 1] == ' ')) n--;
    char *stop = loom_malloc(n + 1);
    memcpy(stop, post, n);
    stop[n] = 0;
    return stop;
}

int loom_chat_prompt(const loom_chat_template *t, const char *system, const char *user,
                     char **prompt, char **stop) {
    loom_chat_doc d = {0};
    puts_(&d, t->bos, 0);
    if (!(system && *system)) system = t->default_system;
    if (t->system_fold) { /* the system text opens the user turn */
        puts_(&d, t->pre[LOOM_ROLE_USER], 0);
        if (system && *system) puts_(&d, system, 0), puts_(&d, t->system_fold, 0);
        puts_(&d, user, 0);
        puts_(&d, t->post[LOOM_ROLE_USER], 0);
        puts_(&d, t->pre[LOOM_ROLE_ASSISTANT], 0);
        *prompt = d.text ? d.text : loom_strdup("");
        free(d.seg);
        *stop = end_of_turn(t);
        return 0;
    }
    if (((system && *system) || t->always_system) && (t->roles & (1u << LOOM_ROLE_SYSTEM))) {
        puts_(&d, t->pre[LOOM_ROLE_SYSTEM], 0);
        if (t->system_prefix) puts_(&d, t->system_prefix, 0);
        if (system) puts_(&d, system, 0);
        puts_(&d, t->post[LOOM_ROLE_SYSTEM], 0);
    }
    puts_(&d, t->pre[LOOM_ROLE_USER], 0);
    puts_(&d, user, 0);
    puts_(&d, t->post[LOOM_ROLE_USER], 0);
    puts_(&d, t->pre[LOOM_ROLE_ASSISTANT], 0);
    *prompt = d.text ? d.text : loom_strdup("");
    free(d.seg);
    *stop = end_of_turn(t);
    return 0;
}

int loom_chat_prompt_messages(const loom_chat_template *t, json_t *messages, char **prompt,
                              char **stop, char *why, size_t ws) {
    return loom_chat_prompt_tools(t, messages, NULL, prompt, stop, why, ws);
}

int loom_chat_prompt_tools(const loom_chat_template *t, json_t *messages, json_t *tools,
                           char **prompt, char **stop, char *why, size_t ws) {
    loom_chat_doc d = {0};
    int assistants;
    if (render_messages(t, messages, tools, &d, &assistants, why, ws)) {
        loom_chat_doc_free(&d);
        return -1;
    }
    puts_(&d, t->pre[LOOM_ROLE_ASSISTANT], 0);
    *prompt = d.text ? d.text : loom_strdup("");
    free(d.seg);
    *stop = end_of_turn(t);
    return 0;
}

/* ---- tool calls in a generated reply ------------------------------------------------------ */

static size_t skip_ws(const char *s, size_t n, size_t i) {
    while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) i++;
    return i;
}

/* s without its leading and trailing whitespace: [*a, *a + *l) */
static void trimmed(const char *s, const char **a, size_t *l) {
    size_t n = strlen(s), i = skip_ws(s, n, 0);
    while (n > i && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\t' || s[n - 1] == '\r')) n--;
    *a = s + i;
    *l = n - i;
}

/* One call's JSON at text[*at]: {"name": ..., ARGS: {...}} appended to calls, *at past it */
static int one_call(const loom_chat_template *t, const char *s, size_t n, size_t *at, json_t *calls) {
    json_error_t je;
    json_t *o = json_loadb(s + *at, n - *at, JSON_DISABLE_EOF_CHECK | JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(o)) {
        json_decref(o);
        return -1;
    }
    *at += (size_t)je.position;
    json_t *name = json_object_get(o, "name"), *args = json_object_get(o, t->args_key);
    size_t keys = json_object_size(o);
    int ok = json_is_string(name) && json_string_length(name) > 0 &&
             (args ? json_is_object(args) && keys == 2 : keys == 1);
    if (ok)
        json_array_append_new(calls, json_pack("{s:O,s:o}", "name", name, "arguments",
                                               args ? json_incref(args) : json_object()));
    json_decref(o);
    return ok ? 0 : -1;
}

int loom_chat_parse_tool_calls(const loom_chat_template *t, const char *s, size_t n,
                               json_t **calls_out, size_t *content_len) {
    *calls_out = NULL;
    *content_len = n;
    if (!t->tools) return 0;
    const char *pre, *post, *sep;
    size_t lpre, lpost, lsep;
    trimmed(t->call_pre, &pre, &lpre);
    trimmed(t->call_post, &post, &lpost);
    trimmed(t->call_sep, &sep, &lsep);
    size_t at, content = 0;
    if (lpre) { /* content, then the first wrapper */
        const char *p = NULL;
        for (size_t i = 0; i + lpre <= n && !p; i++)
            if (!memcmp(s + i, pre, lpre)) p = s + i;
        if (!p) return 0;
        content = (size_t)(p - s);
        at = content;
    } else {
        at = skip_ws(s, n, 0);
        if (at == n || s[at] != '{') return 0;
    }
    json_t *calls = json_array();
    for (;;) {
        at = skip_ws(s, n, at);
        if (lpre) {
            if (at + lpre > n || memcmp(s + at, pre, lpre)) goto no;
            at = skip_ws(s, n, at + lpre);
        }
        if (one_call(t, s, n, &at, calls)) goto no;
        at = skip_ws(s, n, at);
        if (lpost) {
            if (at + lpost > n || memcmp(s + at, post, lpost)) goto no;
            at = skip_ws(s, n, at + lpost);
        }
        if (lsep && at + lsep <= n && !memcmp(s + at, sep, lsep)) at = skip_ws(s, n, at + lsep);
        if (at == n) break;
    }
    while (content > 0 && (s[content - 1] == ' ' || s[content - 1] == '\n' || s[content - 1] == '\t' ||
                           s[content - 1] == '\r'))
        content--;
    *calls_out = calls;
    *content_len = content;
    return (int)json_array_size(calls);
no:
    json_decref(calls);
    return 0;
}
