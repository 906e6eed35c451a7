/* chat_builtin.c — the built-in chat templates (ts_chat_builtin_names):
 * ChatML, Llama 3.1's header format with JSON tool calls, and a plain-text
 * format for base models whose tokenizer has no chat markers (the shipped
 * models/kjv-qwen3 carries the same source in its tokenizer_config.json).
 * Each is rendered by jinja.c like a model's own template. */
#include "chat_builtin.h"

#include "tessera_tokenizer.h"

#include <string.h>

/* <|im_start|>role\ncontent<|im_end|>\n; tools reach it as a system
 * message (prompt.c), since the template does not read `tools` */
static const char chatml[] =
    "{%- for message in messages %}\n"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + "
    "'<|im_end|>\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n";

/* Llama 3.1's turns (<|start_header_id|>role<|end_header_id|>\n\n ...
 * <|eot_id|>); with tools, "Environment: ipython" and the functions as
 * JSON in the system turn, calls answered as {"name", "parameters"}
 * (several joined by "; "), results in ipython turns. */
static const char llama3[] =
    "{{- bos_token if bos_token is defined else '' }}\n"
    "{%- set ns = namespace(system='', first=0) %}\n"
    "{%- if messages and messages[0].role == 'system' %}\n"
    "{%- set ns.system = messages[0].content | trim %}\n"
    "{%- set ns.first = 1 %}\n"
    "{%- endif %}\n"
    "{%- if ns.system or tools %}\n"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}\n"
    "{%- if tools %}\n"
    "{{- 'Environment: ipython\\n\\n' }}\n"
    "{{- 'You have access to the functions below. To call one, reply "
    "with only a JSON object in the format {\"name\": function name, "
    "\"parameters\": dictionary of argument name and its value}; join "
    "several calls with \"; \". Do not use variables.\\n\\n' }}\n"
    "{%- for tool in tools %}\n"
    "{{- tool | tojson(indent=4) }}\n"
    "{{- '\\n\\n' }}\n"
    "{%- endfor %}\n"
    "{%- endif %}\n"
    "{{- ns.system + '<|eot_id|>' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages[ns.first:] %}\n"
    "{%- if message.role == 'tool' or message.role == 'ipython' %}\n"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + "
    "message.content + '<|eot_id|>' }}\n"
    "{%- elif message.role == 'assistant' and message.tool_calls %}\n"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- for call in message.tool_calls %}\n"
    "{%- set fn = call.function if call.function is defined else call %}\n"
    "{%- if not loop.first %}{{- '; ' }}{%- endif %}\n"
    "{{- '{\"name\": \"' + fn.name + '\", \"parameters\": ' }}\n"
    "{{- fn.arguments | tojson }}\n"
    "{{- '}' }}\n"
    "{%- endfor %}\n"
    "{{- '<|eot_id|>' }}\n"
    "{%- else %}\n"
    "{{- '<|start_header_id|>' + message.role + "
    "'<|end_header_id|>\\n\\n' + message.content | trim + '<|eot_id|>' }}\n"
    "{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n";

/* Plain text for a base model: the system text, then "User: ..." and
 * "Assistant: ..." lines, each answer ended by the folder's eos_token. The
 * generation prompt ends in "Assistant:" without a space, because a
 * byte-level BPE puts the space in front of the answer's first word. */
static const char plain[] =
    "{%- for message in messages %}\n"
    "{%- if message.role == 'system' %}\n"
    "{{- message.content + '\\n\\n' }}\n"
    "{%- elif message.role == 'user' %}\n"
    "{{- 'User: ' + message.content + '\\n' }}\n"
    "{%- elif message.role == 'assistant' %}\n"
    "{{- 'Assistant: ' + message.content }}\n"
    "{{- eos_token if eos_token is defined else '' }}\n"
    "{{- '\\n' }}\n"
    "{%- else %}\n"
    "{{- message.role + ': ' + message.content + '\\n' }}\n"
    "{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- 'Assistant:' }}\n"
    "{%- endif %}\n";

static const ts_chat_builtin builtins[] = {
    {"chatml", chatml, "<|im_end|>"},
    {"llama3", llama3, "<|eot_id|>"},
    {"plain", plain, NULL},
};

const ts_chat_builtin *ts_chat_builtin_find(const char *name) {
    for (size_t i = 0; name && i < sizeof builtins / sizeof *builtins; i++)
        if (!strcmp(builtins[i].name, name))
            return &builtins[i];
    return NULL;
}

const char *ts_chat_builtin_names(void) {
    return "chatml,llama3,plain";
}
