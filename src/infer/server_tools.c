/* loom serve: tool calling on /v1/chat/completions (docs/inference.md, "Tools").
 *
 * A request's `tools` (OpenAI function definitions) are checked here and written into the
 * prompt by the chat template (loom_chat_prompt_tools); its `tool_choice` says whether the
 * reply is read back for calls (auto, required, a named function) or not (none); the reply's
 * calls are parsed by the template's own format (loom_chat_parse_tool_calls) and returned as
 * `message.tool_calls`, or streamed as `delta.tool_calls` once the reply is complete (the
 * text before a possible call streams as content as it comes). A reply that does not parse
 * as calls of the given tools is returned as text. */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer/server_internal.h"
#include "loom/grammar.h"

void server_tools_free(tool_req *tr) {
    json_decref(tr->tools);
    memset(tr, 0, sizeof *tr);
}

/* OpenAI: a function name is 1-64 of a-z, A-Z, 0-9, _ and - */
static int good_name(const char *s, size_t n) {
    if (n == 0 || n > 64) return 0;
    for (size_t i = 0; i < n; i++) {
        const char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* fails with the problem in why (256 bytes; the caller has set the parameter's path) */
__attribute__((format(printf, 2, 3))) static int bad(char *why, const char *fmt, ...);
static int bad(char *why, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, 256, fmt, ap);
    va_end(ap);
    return -1;
}

/* a JSON schema's shape where a tool's parameters are: an object; "type", when present, is
 * "object"; "properties" an object of objects; "required" a list of names it has */
static int check_params(json_t *p, const char *at, char *param, size_t ps, char *why) {
    if (!json_is_object(p)) {
        snprintf(param, ps, "%s", at);
        return bad(why, "'%s' must be a JSON schema object", at);
    }
    json_t *type = json_object_get(p, "type");
    if (type && !(json_is_string(type) && !strcmp(json_string_value(type), "object"))) {
        snprintf(param, ps, "%s.type", at);
        return bad(why, "'%s.type' must be \"object\" (a function takes an object of arguments)", at);
    }
    json_t *props = json_object_get(p, "properties");
    if (props) {
        const char *k;
        json_t *v;
        if (!json_is_object(props)) {
            snprintf(param, ps, "%s.properties", at);
            return bad(why, "'%s.properties' must be an object", at);
        }
        json_object_foreach(props, k, v) {
            if (!json_is_object(v) && !json_is_boolean(v)) {
                snprintf(param, ps, "%s.properties.%.64s", at, k);
                return bad(why, "'%s.properties.%.64s' must be a schema (an object)", at, k);
            }
        }
    }
    json_t *req = json_object_get(p, "required");
    if (req) {
        size_t i;
        json_t *x;
        if (!json_is_array(req)) {
            snprintf(param, ps, "%s.required", at);
            return bad(why, "'%s.required' must be a list of property names", at);
        }
        json_array_foreach(req, i, x) {
            if (!json_is_string(x) || (props && !json_object_get(props, json_string_value(x)))) {
                snprintf(param, ps, "%s.required", at);
                return bad(why, "'%s.required[%zu]' is not one of its properties", at, i);
            }
        }
    }
    return 0;
}

int server_tools_read(json_t *req, const loom_chat_template *t, tool_req *tr, char *param, size_t ps,
                      char *why) {
    memset(tr, 0, sizeof *tr);
    tr->parallel = 1;
    json_t *tools = json_object_get(req, "tools");
    if (json_is_null(tools)) tools = NULL;
    if (tools) {
        if (!json_is_array(tools) || json_array_size(tools) > 256) {
            snprintf(param, ps, "tools");
            return bad(why, "'tools' must be a list of at most 256 function definitions");
        }
        size_t i;
        json_t *x;
        json_array_foreach(tools, i, x) {
            char at[32];
            snprintf(at, sizeof at, "tools[%zu]", i);
            json_t *type = json_object_get(x, "type"), *fn = json_object_get(x, "function");
            if (!json_is_object(x) || !json_is_string(type) || strcmp(json_string_value(type), "function")) {
                snprintf(param, ps, "%s.type", at);
                return bad(why, "'%s' must be {\"type\": \"function\", \"function\": {...}}", at);
            }
            if (!json_is_object(fn)) {
                snprintf(param, ps, "%s.function", at);
                return bad(why, "'%s.function' must be an object with a name", at);
            }
            json_t *name = json_object_get(fn, "name"), *desc = json_object_get(fn, "description");
            if (!json_is_string(name) || !good_name(json_string_value(name), json_string_length(name))) {
                snprintf(param, ps, "%s.function.name", at);
                return bad(why, "'%s.function.name' must be 1 to 64 letters, digits, '_' or '-'", at);
            }
            for (size_t k = 0; k < i; k++)
                if (!strcmp(json_string_value(json_object_get(json_object_get(json_array_get(tools, k), "function"), "name")),
                            json_string_value(name))) {
                    snprintf(param, ps, "%s.function.name", at);
                    return bad(why, "'%s.function.name': '%s' is defined twice (also tools[%zu])", at,
                               json_string_value(name), k);
                }
            if (desc && !json_is_string(desc)) {
                snprintf(param, ps, "%s.function.description", at);
                return bad(why, "'%s.function.description' must be a string", at);
            }
            json_t *params = json_object_get(fn, "parameters");
            char pat[96];
            snprintf(pat, sizeof pat, "%s.function.parameters", at);
            if (params && check_params(params, pat, param, ps, why)) return -1;
        }
        if (!t->tools) {
            snprintf(param, ps, "tools");
            return bad(why, "the chat template '%s' has no tool-call format (serve with --template chatml, "
                                       "qwen, llama3, plain or a template file with tool_call)", t->name);
        }
        if (json_array_size(tools)) tr->tools = json_incref(tools);
    }
    json_t *pc = json_object_get(req, "parallel_tool_calls");
    if (pc && !json_is_null(pc)) {
        if (!json_is_boolean(pc)) {
            snprintf(param, ps, "parallel_tool_calls");
            return bad(why, "'parallel_tool_calls' must be a boolean");
        }
        tr->parallel = json_is_true(pc);
    }
    json_t *tc = json_object_get(req, "tool_choice");
    tr->mode = tr->tools ? TOOLS_AUTO : TOOLS_OFF;
    if (!tc || json_is_null(tc)) return 0;
    snprintf(param, ps, "tool_choice");
    if (json_is_string(tc)) {
        const char *s = json_string_value(tc);
        if (!strcmp(s, "none")) tr->mode = TOOLS_OFF;
        else if (!strcmp(s, "auto")) tr->mode = tr->tools ? TOOLS_AUTO : TOOLS_OFF;
        else if (!strcmp(s, "required")) tr->mode = TOOLS_REQUIRED;
        else return bad(why, "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                                        "\"function\": {\"name\": ...}}");
    } else {
        const char *name = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
        const char *type = json_string_value(json_object_get(tc, "type"));
        if (!json_is_object(tc) || !type || strcmp(type, "function") || !name)
            return bad(why, "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                                       "\"function\": {\"name\": ...}}");
        tr->mode = TOOLS_NAMED;
        snprintf(tr->named, sizeof tr->named, "%s", name);
        if (!server_tool_known(tr, name))
            return bad(why, "'tool_choice' names the function '%.64s', which is not in 'tools'", name);
    }
    if ((tr->mode == TOOLS_REQUIRED || tr->mode == TOOLS_NAMED) && !tr->tools)
        return bad(why, "'tool_choice' asks for a tool call but the request has no 'tools'");
    param[0] = 0;
    return 0;
}

int server_tool_known(const tool_req *tr, const char *name) {
    size_t i;
    json_t *x;
    json_array_foreach(tr->tools, i, x) {
        const char *n = json_string_value(json_object_get(json_object_get(x, "function"), "name"));
        if (n && !strcmp(n, name)) return 1;
    }
    return 0;
}

int server_tool_calls(const loom_chat_template *t, const tool_req *tr, const char *text, size_t len,
                      const char *id, json_t **out, size_t *content_len) {
    *out = NULL;
    *content_len = len;
    if (tr->mode == TOOLS_OFF) return 0;
    json_t *calls;
    size_t clen;
    int n = loom_chat_parse_tool_calls(t, text, len, &calls, &clen);
    if (n <= 0) return 0;
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) { /* only calls of the request's tools (of the named one) */
        const char *name = json_string_value(json_object_get(c, "name"));
        if (!server_tool_known(tr, name) || (tr->mode == TOOLS_NAMED && strcmp(name, tr->named))) {
            json_decref(calls);
            return 0;
        }
    }
    if (!tr->parallel && n > 1) n = 1; /* parallel_tool_calls: false: the first call */
    json_t *arr = json_array();
    for (int k = 0; k < n; k++) {
        c = json_array_get(calls, (size_t)k);
        char *args = json_dumps(json_object_get(c, "arguments"), JSON_COMPACT | JSON_PRESERVE_ORDER);
        char cid[96];
        snprintf(cid, sizeof cid, "call_%s_%d", id, k);
        json_array_append_new(arr, json_pack("{s:s,s:s,s:{s:O,s:s}}", "id", cid, "type", "function", "function",
                                             "name", json_object_get(c, "name"), "arguments", args ? args : "{}"));
        free(args);
    }
    json_decref(calls);
    *out = arr;
    *content_len = clen;
    return n;
}

size_t server_tool_safe_prefix(const loom_chat_template *t, const char *s, size_t n) {
    const char *pre = t->call_pre;
    while (*pre == ' ' || *pre == '\n' || *pre == '\t' || *pre == '\r') pre++;
    size_t lp = strlen(pre);
    while (lp && (pre[lp - 1] == ' ' || pre[lp - 1] == '\n' || pre[lp - 1] == '\t' || pre[lp - 1] == '\r')) lp--;
    size_t cut = n;
    if (!lp) { /* the call's JSON alone: a reply that starts with '{' may be all calls */
        size_t i = 0;
        while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) i++;
        return i == n || s[i] == '{' ? 0 : n;
    }
    for (size_t i = 0; i < n; i++) { /* the first wrapper, or a start of one at the end */
        const size_t m = n - i < lp ? n - i : lp;
        if (!memcmp(s + i, pre, m)) {
            cut = i;
            break;
        }
    }
    while (cut > 0 && (s[cut - 1] == ' ' || s[cut - 1] == '\n' || s[cut - 1] == '\t' || s[cut - 1] == '\r')) cut--;
    return cut;
}

/* tool_choice required / a named function: the reply constrained to calls in the template's
 * format, each {"name": one of the tools (or the named one), ARGS: its parameters' schema}
 * (the keys in that order, as the template writes a call); up to 8 calls with
 * parallel_tool_calls, else one */
int server_tools_grammar(server *S, const tool_req *tr, loom_grammar **out, char *why, size_t n) {
    *out = NULL;
    if (tr->mode != TOOLS_REQUIRED && tr->mode != TOOLS_NAMED) return 0;
    const loom_chat_template *t = S->chat_tpl;
    json_t *any = json_array();
    size_t i;
    json_t *x;
    json_array_foreach(tr->tools, i, x) {
        json_t *fn = json_object_get(x, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (tr->mode == TOOLS_NAMED && strcmp(name, tr->named)) continue;
        json_t *params = json_object_get(fn, "parameters");
        json_t *props = json_object();
        json_object_set_new(props, "name", json_pack("{s:s}", "const", name));
        json_object_set_new(props, t->args_key, params ? json_incref(params) : json_pack("{s:s}", "type", "object"));
        json_array_append_new(any, json_pack("{s:s,s:o,s:[s,s]}", "type", "object", "properties", props,
                                             "required", "name", t->args_key));
    }
    json_t *schema = json_array_size(any) == 1 ? json_incref(json_array_get(any, 0)) : json_pack("{s:O}", "anyOf", any);
    json_decref(any);
    char *text = json_dumps(schema, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(schema);
    loom_err err = {{0}};
    const int max_calls = tr->mode == TOOLS_NAMED || !tr->parallel ? 1 : 8;
    const int rc = loom_grammar_tool_calls(t->call_pre, text, t->call_post, t->call_sep, max_calls, S->gcache, out, &err);
    free(text);
    if (rc) snprintf(why, n, "the tools' parameters cannot constrain a call: %s", err.msg);
    return rc;
}
