"""The chat-template check `searchrl train` runs before a launch (issue 32): a template that drops the tool stops it.

verl's agent loop renders each prompt with the tokenizer's chat template and `tools=` the search schema. A model
whose template ignores `tools=` (SmolLM2-135M-Instruct's does: same prompt with and without the schema) would be
trained on prompts with no tool in them and nothing would say so. So before data prep the launch loads the
model's tokenizer, renders the probe both ways (searchrl/chat_template.py) and either refuses with one line or,
with `CHAT_TEMPLATE=searchrl`, checks the repo's ChatML/hermes template fits the tokenizer; that template then
reaches verl as `actor_rollout_ref.model.custom_chat_template` (trainer/overrides.py).

The tokenizer comes from the model folder or the HF cache, else the Hub (a few small files; verl downloads the
same id right after). Offline (`HF_HUB_OFFLINE=1`) and not cached, the check cannot run: it says so in a warning
naming what verl will use, rather than stopping a launch that may be fine.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from searchrl.chat_template import prepare_chat_template
from searchrl.errors import ConfigError
from searchrl.trainer.settings import TrainSettings

log = logging.getLogger(__name__)

TRAIN_FIX = "set CHAT_TEMPLATE=searchrl (--chat-template searchrl) to train with the repo's ChatML/hermes tool template"


def load_tokenizer(model_name: str) -> Any | None:
    """The model's tokenizer from its folder or the cache, else the Hub unless offline; None when neither works."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_name, local_files_only=True)
    except (OSError, ValueError) as exc:
        if os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes"}:
            log.debug("tokenizer of %s not on this machine: %s", model_name, exc)
            return None
    try:
        return AutoTokenizer.from_pretrained(model_name)
    except (OSError, ValueError) as exc:
        log.debug("tokenizer of %s not loadable: %s", model_name, exc)
        return None


def check_train_template(settings: TrainSettings) -> str:
    """Which template the run trains with ("model" | "searchrl"), or "unchecked"; ConfigError when it drops tools."""
    model = settings.model_name
    tokenizer = load_tokenizer(model)
    if tokenizer is None:
        log.warning(
            "chat template of %s not checked: its tokenizer is neither on this machine nor downloadable here; "
            "verl will render prompts with %s",
            model,
            "the repo's ChatML/hermes template"
            if settings.chat_template == "searchrl"
            else "the model's own",
        )
        return "unchecked"
    if settings.chat_template == "model" and not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"{model} has no chat template, so verl cannot render its prompts; set CHAT_TEMPLATE=searchrl "
            "(the repo's ChatML/hermes tool template) or use an instruct model"
        )
    # the eval's check, naming the trainer's setting as the fix; "searchrl" refuses a tokenizer without ChatML
    return prepare_chat_template(tokenizer, model=model, choice=settings.chat_template, fix=TRAIN_FIX)


__all__ = ["check_train_template", "load_tokenizer"]
