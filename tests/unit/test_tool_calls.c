/* Tool calls read back from a generated reply (loom_chat_parse_tool_calls, src/data/chat.c) in
 * the built-in templates' formats (chatml's <tool_call> wrapper, plain's bare JSON, llama3's
 * "parameters" key), what the server streams as content before the reply is complete
 * (server_tool_safe_prefix), the server's filter (calls of the request's tools only, one
 * call when parallel_tool_calls is false) and its OpenAI tool_calls objects; and the round trip:
 * every reply that loom_chat_render writes for an assistant turn with calls parses back to
 * those calls. */
#include "testutil.h"

#include <jansson.h>

#include "infer/server_internal.h"
#include "loom/chat.h"

static loom_chat_template *tpl(const char *name) {
    loom_chat_template *t = NULL;
    loom_err err;
    assert_int_equal(loom_chat_template_load(name, &t, &err), 0);
    return t;
}

/* the number of calls in s, and the content's length */
static int parse(const loom_chat_template *t, const char *s, json_t **calls, size_t *clen) {
    return loom_chat_parse_tool_calls(t, s, strlen(s), calls, clen);
}

static void expect_call(json_t *calls, size_t i, const char *name, const char *args) {
    json_t *c = json_array_get(calls, i);
    assert_non_null(c);
    assert_string_equal(json_string_value(json_object_get(c, "name")), name);
    char *a = json_dumps(json_object_get(c, "arguments"), JSON_COMPACT | JSON_SORT_KEYS);
    assert_string_equal(a, args);
    free(a);
}

static void test_chatml(void **state) {
    (void)state;
    loom_chat_template *t = tpl("chatml");
    json_t *calls;
    size_t clen;
    assert_int_equal(parse(t, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>",
                           &calls, &clen), 1);
    assert_int_equal(clen, 0);
    expect_call(calls, 0, "add", "{\"a\":1,\"b\":2}");
    json_decref(calls);
    /* content first (its trailing newline dropped), then two calls with lenient whitespace */
    const char *two = "let me see\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n"
                      "<tool_call>{\"name\":\"g\",\"arguments\":{\"x\":[1,\"é\"]}}</tool_call>\n";
    assert_int_equal(parse(t, two, &calls, &clen), 2);
    assert_int_equal(clen, strlen("let me see"));
    expect_call(calls, 0, "f", "{}");
    expect_call(calls, 1, "g", "{\"x\":[1,\"é\"]}");
    json_decref(calls);
    /* not calls: text after the last call, an unclosed wrapper, bad JSON, other keys, a name
     * that is not a string, arguments that are not an object */
    const char *bad[] = {
        "hello", "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call> and more",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}", "<tool_call>\n{\"name\": \"f\", \"arguments\": {\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {}, \"x\": 1}\n</tool_call>",
        "<tool_call>\n{\"name\": 3, \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{}\"}\n</tool_call>",
        "<tool_call>\n{\"name\": \"\", \"arguments\": {}}\n</tool_call>", "<tool_call>\n[1]\n</tool_call>", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(parse(t, bad[i], &calls, &clen), 0);
        assert_null(calls);
        assert_int_equal(clen, strlen(bad[i]));
    }
    loom_chat_template_free(t);
}

static void test_plain_and_llama3(void **state) {
    (void)state;
    loom_chat_template *t = tpl("plain");
    json_t *calls;
    size_t clen;
    /* bare JSON: the whole reply must be calls; the arguments key may be missing */
    assert_int_equal(parse(t, " {\"name\": \"add\", \"arguments\": {\"a\": 1}}\n{\"name\": \"nop\"}\n", &calls, &clen), 2);
    assert_int_equal(clen, 0);
    expect_call(calls, 0, "add", "{\"a\":1}");
    expect_call(calls, 1, "nop", "{}");
    json_decref(calls);
    assert_int_equal(parse(t, "sure: {\"name\": \"add\", \"arguments\": {}}", &calls, &clen), 0);
    assert_int_equal(parse(t, "{\"name\": \"add\", \"arguments\": {}} done", &calls, &clen), 0);
    loom_chat_template_free(t);
    t = tpl("llama3");
    assert_int_equal(parse(t, "{\"name\": \"add\", \"parameters\": {\"a\": 1}}", &calls, &clen), 1);
    expect_call(calls, 0, "add", "{\"a\":1}");
    json_decref(calls);
    assert_int_equal(parse(t, "{\"name\": \"add\", \"arguments\": {\"a\": 1}}", &calls, &clen), 0);
    loom_chat_template_free(t);
    /* a template without a tool-call format reads no calls */
    t = tpl("gemma");
    assert_int_equal(parse(t, "{\"name\": \"add\", \"arguments\": {}}", &calls, &clen), 0);
    loom_chat_template_free(t);
}

/* what loom_chat_render writes for an assistant turn with calls parses back to them */
static void test_round_trip(void **state) {
    (void)state;
    const char *names[] = {"plain", "chatml", "qwen", "llama3"};
    for (int n = 0; n < 4; n++) {
        loom_chat_template *t = tpl(names[n]);
        for (int k = 1; k <= 3; k++) {
            json_t *tc = json_array();
            for (int i = 0; i < k; i++)
                json_array_append_new(tc, json_pack("{s:s,s:{s:s,s:{s:i,s:[s]}}}", "type", "function", "function",
                                                    "name", i % 2 ? "mul" : "add", "arguments", "a", i, "b", "ü"));
            json_t *msgs = json_pack("[{s:s,s:s},{s:s,s:n,s:o}]", "role", "user", "content", "q", "role", "assistant",
                                     "content", "tool_calls", tc);
            loom_chat_doc d = {0}, u = {0};
            char why[256];
            assert_int_equal(loom_chat_render(t, msgs, &d, why, sizeof why), 0);
            json_t *user = json_pack("[{s:s,s:s}]", "role", "user", "content", "q");
            char *prompt, *stop;
            assert_int_equal(loom_chat_prompt_messages(t, user, &prompt, &stop, why, sizeof why), 0);
            /* the reply: after the prompt, up to the assistant's closing text */
            const size_t pl = strlen(prompt), post = strlen(t->post[LOOM_ROLE_ASSISTANT]);
            assert_true(d.len > pl + post && !memcmp(d.text, prompt, pl));
            assert_memory_equal(d.text + d.len - post, t->post[LOOM_ROLE_ASSISTANT], post);
            const char *end = d.text + d.len - post;
            json_t *calls;
            size_t clen;
            assert_int_equal(loom_chat_parse_tool_calls(t, d.text + pl, (size_t)(end - d.text - pl), &calls, &clen), k);
            assert_int_equal(clen, 0);
            for (int i = 0; i < k; i++) {
                char want[64];
                snprintf(want, sizeof want, "{\"a\":%d,\"b\":[\"ü\"]}", i);
                expect_call(calls, (size_t)i, i % 2 ? "mul" : "add", want);
            }
            json_decref(calls);
            json_decref(msgs);
            json_decref(user);
            free(prompt);
            free(stop);
            loom_chat_doc_free(&d);
            loom_chat_doc_free(&u);
        }
        loom_chat_template_free(t);
    }
}

static void test_safe_prefix(void **state) {
    (void)state;
    loom_chat_template *t = tpl("chatml");
    struct {
        const char *text;
        size_t safe;
    } cases[] = {
        {"hello world", 11},      /* no wrapper in sight: all of it */
        {"hello world\n", 11},    /* trailing whitespace waits */
        {"hello <tool", 5},       /* a possible start of <tool_call> waits, and the space before */
        {"hello <tool_call>\n{\"na", 5},
        {"hello <toolbox", 14},   /* not a wrapper after all */
        {"<tool_call>", 0},
        {"", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        assert_int_equal(server_tool_safe_prefix(t, cases[i].text, strlen(cases[i].text)), cases[i].safe);
    loom_chat_template_free(t);
    t = tpl("plain"); /* bare JSON: a reply starting with '{' waits whole; others stream */
    assert_int_equal(server_tool_safe_prefix(t, "  {\"name\"", 9), 0);
    assert_int_equal(server_tool_safe_prefix(t, "  ", 2), 0);
    assert_int_equal(server_tool_safe_prefix(t, "the answer {", 12), 12);
    loom_chat_template_free(t);
}

/* the server's side: calls of the request's tools only, the named one only, the first one
 * when parallel_tool_calls is false; OpenAI's objects (id, type, arguments as a JSON text) */
static void test_server_filter(void **state) {
    (void)state;
    loom_chat_template *t = tpl("chatml");
    json_t *req = json_pack("{s:[{s:s,s:{s:s}},{s:s,s:{s:s}}]}", "tools", "type", "function", "function", "name", "add",
                            "type", "function", "function", "name", "mul");
    tool_req tr;
    char param[96], why[256];
    assert_int_equal(server_tools_read(req, t, &tr, param, sizeof param, why), 0);
    assert_int_equal(tr.mode, TOOLS_AUTO);
    const char *two = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>\n"
                      "<tool_call>\n{\"name\": \"mul\", \"arguments\": {}}\n</tool_call>";
    json_t *calls;
    size_t clen;
    assert_int_equal(server_tool_calls(t, &tr, two, strlen(two), "x-1", &calls, &clen), 2);
    json_t *c0 = json_array_get(calls, 0);
    assert_string_equal(json_string_value(json_object_get(c0, "id")), "call_x-1_0");
    assert_string_equal(json_string_value(json_object_get(c0, "type")), "function");
    assert_string_equal(json_string_value(json_object_get(json_object_get(c0, "function"), "arguments")), "{\"a\":1}");
    json_decref(calls);
    tr.parallel = 0;
    assert_int_equal(server_tool_calls(t, &tr, two, strlen(two), "x-1", &calls, &clen), 1);
    json_decref(calls);
    const char *other = "<tool_call>\n{\"name\": \"div\", \"arguments\": {}}\n</tool_call>";
    assert_int_equal(server_tool_calls(t, &tr, other, strlen(other), "x", &calls, &clen), 0);
    assert_null(calls);
    tr.mode = TOOLS_OFF;
    assert_int_equal(server_tool_calls(t, &tr, two, strlen(two), "x", &calls, &clen), 0);
    server_tools_free(&tr);
    /* tool_choice forms */
    json_object_set_new(req, "tool_choice", json_pack("{s:s,s:{s:s}}", "type", "function", "function", "name", "mul"));
    assert_int_equal(server_tools_read(req, t, &tr, param, sizeof param, why), 0);
    assert_int_equal(tr.mode, TOOLS_NAMED);
    assert_string_equal(tr.named, "mul");
    assert_int_equal(server_tool_calls(t, &tr, two, strlen(two), "x", &calls, &clen), 0); /* add is not mul */
    server_tools_free(&tr);
    json_object_set_new(req, "tool_choice", json_string("none"));
    assert_int_equal(server_tools_read(req, t, &tr, param, sizeof param, why), 0);
    assert_int_equal(tr.mode, TOOLS_OFF);
    assert_non_null(tr.tools); /* still described in the prompt */
    server_tools_free(&tr);
    json_object_set_new(req, "tool_choice", json_string("maybe"));
    assert_int_equal(server_tools_read(req, t, &tr, param, sizeof param, why), -1);
    assert_string_equal(param, "tool_choice");
    server_tools_free(&tr);
    json_decref(req);
    /* a template without a tool-call format refuses tools, naming them */
    loom_chat_template *g = tpl("gemma");
    req = json_pack("{s:[{s:s,s:{s:s}}]}", "tools", "type", "function", "function", "name", "add");
    assert_int_equal(server_tools_read(req, g, &tr, param, sizeof param, why), -1);
    assert_string_equal(param, "tools");
    assert_non_null(strstr(why, "gemma"));
    server_tools_free(&tr);
    json_decref(req);
    loom_chat_template_free(g);
    loom_chat_template_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chatml),         cmocka_unit_test(test_plain_and_llama3),
        cmocka_unit_test(test_round_trip),     cmocka_unit_test(test_safe_prefix),
        cmocka_unit_test(test_server_filter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
