"""The repo's ChatML + hermes tool template, and the check that a model's own template does not drop the tool.

Some instruct models' chat templates ignore `tools=`: SmolLM2-135M-Instruct's renders byte-identical prompts with
and without the tool schema, and writes tool results as `<|im_start|>tool ...` without the `<tool_response>`
tags our prompt promises (../shared/DESIGN.md section 5d). With such a template the searchrl prompt format sends
the model a prompt that has no tool in it, and nothing would say so. `prepare_chat_template` renders the prompt
both ways before a run (eval calls it, and the trainer can call it on verl's tokenizer) and stops with one line
naming the model and the two fixes: the repo's template (`--chat-template searchrl`), or `--prompt-format
search-r1`, whose instructions sit in the user turn. Which template ran is recorded in the eval protocol (and so
in its hash).

`CHATML_HERMES_TEMPLATE` is the layout Qwen2.5-Instruct uses: tools in the system turn inside `<tools></tools>`,
assistant calls as `<tool_call>{json}</tool_call>`, tool results as a user turn of `<tool_response>` blocks. The
tiny training model (trainer/cpu/tiny_model.py) ships it too.
"""

from __future__ import annotations

from typing import Any, Literal

from searchrl.errors import ConfigError

ChatTemplateChoice = Literal["model", "searchrl"]
CHAT_TEMPLATE_CHOICES: tuple[str, ...] = ("model", "searchrl")
# the markers CHATML_HERMES_TEMPLATE writes: each must be one token of the model's vocabulary
CHATML_MARKERS = ("<|im_start|>", "<|im_end|>")

CHATML_HERMES_TEMPLATE = """\
{%- set default_system = 'You are a helpful assistant.' -%}
{%- if messages and messages[0].role == 'system' -%}
  {%- set system_text = messages[0].content -%}
  {%- set rest = messages[1:] -%}
{%- else -%}
  {%- set system_text = default_system -%}
  {%- set rest = messages -%}
{%- endif -%}
{{- '<|im_start|>system\\n' + system_text -}}
{%- if tools -%}
  {{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' -}}
  {{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}
  {%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}
  {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments ' -}}
  {{- 'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' -}}
  {{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>' -}}
{%- endif -%}
{{- '<|im_end|>\\n' -}}
{%- for message in rest -%}
  {%- if message.role == 'tool' -%}
    {%- if loop.first or rest[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' -}}
    {%- if loop.last or rest[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
  {%- elif message.role == 'assistant' -%}
    {{- '<|im_start|>assistant' -}}
    {%- if message.content -%}{{- '\\n' + message.content -}}{%- endif -%}
    {%- for call in (message.tool_calls or []) -%}
      {%- set fn = call.function if call.function is defined else call -%}
      {{- '\\n<tool_call>\\n{"name": "' + fn.name + '", "arguments": ' -}}
      {%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}
      {{- '}\\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\\n' -}}
  {%- else -%}
    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""

_PROBE = [{"role": "user", "content": "Who directed The Seventh Seal?"}]


def drops_tools(tokenizer: Any, tools: list[dict[str, Any]] | None = None) -> bool:
    """Whether the tokenizer's chat template renders the same prompt with and without the tool schema."""
    from searchrl.rollout import training_tool_schemas

    def render(with_tools: list[dict[str, Any]] | None) -> str:
        return str(
            tokenizer.apply_chat_template(
                _PROBE, tools=with_tools, add_generation_prompt=True, tokenize=False
            )
        )

    return render(tools or training_tool_schemas()) == render(None)


def use_repo_template(tokenizer: Any, *, model: str) -> None:
    """Replace the tokenizer's chat template by CHATML_HERMES_TEMPLATE (ChatML models only)."""
    for marker in CHATML_MARKERS:
        ids = tokenizer.encode(marker, add_special_tokens=False)
        if len(ids) != 1:
            raise ConfigError(
                f"--chat-template searchrl writes ChatML, but {model}'s tokenizer splits {marker} into "
                f"{len(ids)} tokens; use --prompt-format search-r1 or a model whose own template renders tools"
            )
    tokenizer.chat_template = CHATML_HERMES_TEMPLATE


EVAL_FIX = (
    "pass --chat-template searchrl (the repo's ChatML/hermes tool template) or --prompt-format search-r1"
)


def prepare_chat_template(
    tokenizer: Any, *, model: str, choice: str = "model", tools: bool = True, fix: str = EVAL_FIX
) -> str:
    """Make `tokenizer` render what the run needs and return which template that is ("model" | "searchrl").

    `choice="searchrl"` puts the repo's template in place; "model" keeps the model's own and, when the run
    passes tools (`tools=True`: the searchrl prompt format with search on), refuses one that drops them, the
    error ending with `fix` (eval's flags by default; the trainer names its setting).
    """
    if choice not in CHAT_TEMPLATE_CHOICES:
        raise ConfigError(f"chat template {choice!r} unknown; use one of {', '.join(CHAT_TEMPLATE_CHOICES)}")
    if choice == "searchrl":
        use_repo_template(tokenizer, model=model)
        return "searchrl"
    if tools and getattr(tokenizer, "chat_template", None) and drops_tools(tokenizer):
        raise ConfigError(
            f"the chat template of {model} ignores tools= (the prompt renders identical with and without the "
            f"search tool schema), so the model would never see the tool; {fix}"
        )
    return "model"


__all__ = [
    "CHATML_MARKERS",
    "CHATML_HERMES_TEMPLATE",
    "CHAT_TEMPLATE_CHOICES",
    "EVAL_FIX",
    "ChatTemplateChoice",
    "drops_tools",
    "prepare_chat_template",
    "use_repo_template",
]
