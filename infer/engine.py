"""The generation engine an eval run talks to, opened and checked before the first question.

`server`: an OpenAI-compatible endpoint (sglang, vLLM, ...), waited for and asked what it serves; `sglang`: a
server this process starts and stops (infer/sglang.py); `local`: the weights loaded in this process
(infer/local.py). The chat template is checked before any weights load, so a template that drops the `search`
tool stops the run in seconds.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from searchrl.infer.llm import ChatRenderer, ServerLLM, TextGenerator, load_tokenizer
from searchrl.infer.settings import InferSettings

log = logging.getLogger(__name__)


async def open_engine(settings: InferSettings) -> tuple[TextGenerator | ServerLLM, ChatRenderer | None]:
    """The engine `settings` name, answering, and the renderer when prompts are rendered here (completions, local)."""
    if settings.engine == "local":
        from searchrl.infer.local import LocalLLM, pick_device
        from searchrl.models import resolve_model

        # a known name (`searchrl model get`) loads from its folder, got on first use; the protocol keeps the name
        model = await asyncio.to_thread(resolve_model, settings.model)
        tok_path = await asyncio.to_thread(resolve_model, settings.tokenizer) if settings.tokenizer else model
        # the template check needs only the tokenizer: a template that drops the tool stops the run before the
        # weights load
        tokenizer = await asyncio.to_thread(load_tokenizer, tok_path)
        _prepare_template(tokenizer, settings)
        if pick_device(settings.device) == "cpu":
            log.info("%s", turn_budget_notice(settings))
        llm_local = await asyncio.to_thread(
            LocalLLM.from_pretrained,
            model,
            tokenizer=tokenizer,
            device=settings.device,
            threads=settings.local_threads,
        )
        return llm_local, ChatRenderer(llm_local.tokenizer)
    client_kwargs: dict[str, Any] = {
        "timeout_s": settings.llm_timeout_s,
        "max_retries": settings.llm_max_retries,
        "retry_max_wait_s": settings.llm_retry_max_wait_s,
        "max_connections": max(settings.concurrency, 8),
    }
    server: ServerLLM
    if settings.engine == "sglang":
        from searchrl.infer.sglang import start_sglang

        server = await start_sglang(
            settings.model,
            command=settings.sglang_command,
            extra_args=settings.sglang_args,
            startup_timeout_s=settings.sglang_startup_timeout_s,
            log_dir=settings.output_dir,
            deterministic=settings.deterministic,
            tool_call_parser=settings.api == "chat",
            **client_kwargs,
        )
    else:
        server = ServerLLM(
            settings.llm_url, settings.model, api_key=settings.llm_api_key_value(), **client_kwargs
        )
    try:
        await server.check_model(wait_s=settings.wait_for_llm_s)
        server.identity = await server.model_identity()
        renderer = None
        if settings.api == "completions":
            tokenizer = await asyncio.to_thread(load_tokenizer, settings.tokenizer or settings.model)
            _prepare_template(tokenizer, settings)
            renderer = ChatRenderer(tokenizer)
    except BaseException:
        await server.aclose()
        raise
    return server, renderer


def turn_budget_notice(settings: InferSettings) -> str:
    """What one turn may generate and the flags that cap it, said before a local CPU eval starts.

    A model that never writes EOS (SmolLM2-135M rambles) runs every turn to this budget, at tens of tokens/s
    on a CPU: minutes per question with the bar at 0 unless one knows why.
    """
    spec = settings.rollout
    cap, most = spec.max_tokens_per_turn, spec.max_response_tokens
    if cap is None:
        why = f"what is left of --max-response-tokens {most}; no --max-tokens-per-turn"
    elif cap < most:
        why = f"--max-tokens-per-turn {cap}"
    else:
        why = f"--max-response-tokens {most}, below --max-tokens-per-turn {cap}"
    if settings.search:
        question = f"a question up to {most:,} over up to {spec.max_assistant_turns} turns"
    else:
        question = "one turn a question (no search)"
    return (
        f"local engine on CPU: a turn may generate up to {spec.turn_token_budget(0):,} tokens ({why}), "
        f"{question}; a model that does not stop runs to the cap at tens of tokens/s: cap it with "
        "--max-tokens-per-turn N (or --max-response-tokens N)"
    )


def _prepare_template(tokenizer: Any, settings: InferSettings) -> str:
    """The chat template the run renders with: the repo's when asked, else the model's once it keeps tools=."""
    from searchrl.chat_template import prepare_chat_template

    return prepare_chat_template(
        tokenizer,
        model=settings.model,
        choice=settings.chat_template,
        tools=settings.search and settings.prompt_format == "searchrl",
    )


def engine_identity(llm: TextGenerator | ServerLLM) -> dict[str, Any]:
    """What identifies the weights: the server's answer (`open_engine`) or the local files' hash."""
    if isinstance(llm, ServerLLM):
        return dict(getattr(llm, "identity", None) or {})
    ident = getattr(llm, "weights_identity", None)
    return ident() if callable(ident) else {}


__all__ = ["engine_identity", "open_engine", "turn_budget_notice"]
