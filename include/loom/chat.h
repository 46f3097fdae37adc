/* Chat templates: OpenAI-format conversations (system | user | assistant | tool messages,
 * assistant tool_calls) rendered as text with a loss mask that trains only on what the
 * assistant says (its content, its tool calls and its end-of-turn marker). Built in: chatml
 * and llama3 (and plain: "role: content" lines, no special tokens); or a JSON template file with {content} placeholders. See docs/finetune.md.
 * (src/data/chat.c) */
#ifndef LOOM_CHAT_H
#define LOOM_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "loom/base.h"
#include "loom/tokenizer.h"

enum { LOOM_ROLE_SYSTEM, LOOM_ROLE_USER, LOOM_ROLE_ASSISTANT, LOOM_ROLE_TOOL, LOOM_ROLE_COUNT };

typedef struct loom_chat_template {
    char *name;
    char *bos;                       /* once at the start of a conversation ("" for none) */
    char *pre[LOOM_ROLE_COUNT];      /* the text before a message's content */
    char *post[LOOM_ROLE_COUNT];     /* the text after it (the assistant's is trained on) */
    char *call_pre, *call_post;      /* around each tool call's JSON */
    char *call_sep;                  /* between the content and the calls, and between calls */
    char *args_key;                  /* the tool call JSON's arguments key */
    char *default_system;            /* rendered as the system message when a conversation has
                                      * none (Qwen's templates; NULL for none) */
    unsigned roles;                  /* bit r set: role r is allowed (mistral, gemma: user and
                                      * assistant only, as their Jinja templates raise otherwise) */
    int tools;                       /* assistant tool_calls allowed */
    char *system_prefix;             /* before the first system message's content ("" / NULL) */
    int always_system;               /* a system message is rendered even when there is none
                                      * (llama3.1: its dated header around an empty message) */
    char *tool_open, *tool_close;    /* around each run of consecutive tool messages (qwen: one
                                      * user turn holds them), NULL for none */
    char *system_fold;               /* a leading system message is not a turn: its content and
                                      * this separator open the first user turn (gemma3), NULL */
    char *tools_block;               /* how the tool definitions are written into the system
                                      * message: text with {tools} once (the tools' JSON texts,
                                      * one per line); NULL: the template cannot describe tools */
} loom_chat_template;

/* "plain", "chatml", "qwen", "llama3", "llama3.1", "mistral", "gemma", "gemma3", a Hugging Face
 * tokenizer_config.json (its chat_template recognized as one of the built-ins, see
 * loom_chat_template_detect), or the path of a JSON template file:
 *   {"bos": "", "system": "...{content}...", "user": ..., "assistant": ..., "tool": ...,
 *    "tool_call": "<tool_call>\n{content}\n</tool_call>", "tool_call_separator": "\n",
 *    "arguments_key": "arguments", "tools": "# Tools\n...{tools}..."}
 * every role string holds {content} exactly once, "tools" (optional) {tools} once. */
int loom_chat_template_load(const char *spec, loom_chat_template **out, loom_err *err);
void loom_chat_template_free(loom_chat_template *t);
/* 1 when name is a built-in template (plain, chatml, qwen, llama3, llama3.1, mistral, gemma,
 * gemma3). */
int loom_chat_template_is_builtin(const char *name);
/* The built-in template that a Hugging Face Jinja chat template (the text of
 * tokenizer_config.json's chat_template) renders like, recognized by its literal markers and
 * never executed: "chatml", "qwen", "llama3", "llama3.1", "mistral", "gemma" or "gemma3", or NULL
 * when it is none of them (*why then says what was missing or what loom cannot reproduce). *default_system: a fixed
 * system message the template renders when a conversation has none (malloc'd, or NULL). */
const char *loom_chat_template_detect(const char *jinja, size_t len, char **default_system, const char **why);
/* The template as Hugging Face Jinja (malloc'd; what `loom export --hf` writes into
 * tokenizer_config.json's chat_template): apply_chat_template renders every conversation
 * loom_chat_render takes as loom does (tool-call arguments given as a JSON text are written as
 * that text), add_generation_prompt opens the assistant's turn, and a conversation loom
 * refuses raises. It starts with a marker that loom_chat_template_detect reads back (the
 * name and default system message). */
char *loom_chat_template_jinja(const loom_chat_template *t);
/* The same for a tokenizer_config.json file (its chat_template: a string, or a list of
 * {name, template} of which "default" is taken): the name in *name (static), the default
 * system message in *default_system (malloc'd or NULL). -1 with an error naming the file when
 * it has no chat_template or an unrecognized one. */
int loom_chat_template_detect_file(const char *path, const char **name, char **default_system, loom_err *err);
/* For an import: the built-in that DIR/tokenizer_config.json's chat_template matches (*name
 * malloc'd, *default_system malloc'd or NULL); both NULL when the file is missing, has no
 * chat_template or an unrecognized one (the user then names the template). */
void loom_chat_template_from_hf_dir(const char *dir, char **name, char **default_system);

/* A rendered conversation: text, cut into segments, each trained on (1) or not (0). */
typedef struct loom_chat_seg {
    uint64_t end;   /* the segment is text[previous end, end) */
    uint8_t train;
} loom_chat_seg;
typedef struct loom_chat_doc {
    char *text;
    size_t len, cap;
    loom_chat_seg *seg;
    size_t n_seg, cap_seg;
} loom_chat_doc;
void loom_chat_doc_free(loom_chat_doc *d);

/* Renders a JSON messages array (OpenAI format) into d. On a malformed conversation returns
 * -1 with the reason in why ("message 2: role 'x' is not system, user, assistant or tool"). */
struct json_t;
int loom_chat_render(const loom_chat_template *t, struct json_t *messages, loom_chat_doc *d,
                     char *why, size_t why_size);

/* The same with tool definitions (an OpenAI `tools` list, NULL or empty for none): they are
 * written into the system message by the template's tools_block (after the system message's
 * content, or the default system message, and a blank line; a system message is made when
 * the conversation has none). -1 with the reason when the template has no tools_block or a
 * tool is not a JSON object. */
int loom_chat_render_tools(const loom_chat_template *t, struct json_t *messages,
                           struct json_t *tools, loom_chat_doc *d, char *why, size_t why_size);

/* Tokens and loss mask of a rendered conversation: each segment is encoded on its own (so the
 * mask follows the segments exactly; the template's special tokens are added tokens of a BPE
 * tokenizer, matched whole), mask = the segment's train flag. */
int loom_chat_encode(const loom_chat_doc *d, const loom_tokenizer *tok, loom_ids *ids,
                     uint8_t **mask, loom_err *err);

/* The prompt for generating the assistant's next turn after one user message (and an optional
 * system message): bos + system + user + the assistant's opening; *stop = the assistant's
 * end-of-turn marker (its post text without trailing whitespace). Both malloc'd. */
int loom_chat_prompt(const loom_chat_template *t, const char *system, const char *user,
                     char **prompt, char **stop);

/* The same for a whole conversation (OpenAI messages, as loom_chat_render takes, but with no
 * assistant message needed): every message, then the assistant's opening. -1 with the reason
 * in why on a malformed conversation. The server's /v1/chat/completions and loom synth's chat
 * form build their prompts with it. */
int loom_chat_prompt_messages(const loom_chat_template *t, struct json_t *messages,
                              char **prompt, char **stop, char *why, size_t why_size);
/* ... with tool definitions, as loom_chat_render_tools writes them */
int loom_chat_prompt_tools(const loom_chat_template *t, struct json_t *messages,
                           struct json_t *tools, char **prompt, char **stop, char *why,
                           size_t why_size);

/* Tool calls in a generated assistant reply, as the template writes them (its tool_call
 * wrapper, separator and arguments key): with a wrapper (e.g. <tool_call>...</tool_call>),
 * content up to the first wrapper's start, then one or more wrapped calls separated by the
 * separator or whitespace, up to the end (trailing whitespace allowed); without one (the
 * call's JSON alone), the whole reply (leading and trailing whitespace aside) must be calls.
 * Each call is {"name": NAME, ARGS_KEY: {...}} (the arguments key may be missing: {}).
 * Returns the number of calls (0 when the reply is not calls: it is then all content) with
 * *calls a new JSON array of {"name": ..., "arguments": {...}} and *content_len the length
 * of the content before them (trailing whitespace removed). */
int loom_chat_parse_tool_calls(const loom_chat_template *t, const char *text, size_t len,
                               struct json_t **calls, size_t *content_len);

#endif
