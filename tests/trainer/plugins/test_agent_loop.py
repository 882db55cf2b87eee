"""verl's own ToolAgentLoop, a scripted token server, OUR search tool against a LIVE retrieval service.

The only fake is the LLM (it cannot run here): a server_manager whose generate() returns verl's TokenOutput with
the token ids of scripted replies. Everything else is real: data prep -> parquet -> verl's RLHFDataset row ->
ToolAgentLoop.run() with the tool verl loads from our YAML -> uvicorn BM25 service -> observation tokens ->
verl's reward manager calling our reward function through `pkg://searchrl.trainer.plugins.reward`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from searchrl.trainer.data import prepare_data
from searchrl.trainer.overrides import render_overrides
from searchrl.trainer.settings import TrainSettings
from searchrl.trainer.toolconfig import write_tool_config
from tests.trainer.conftest import SCRIPTED_TEXTS, SEVENTH_SEAL_QUESTION, fixture_settings

pytestmark = [pytest.mark.live, pytest.mark.slow]

THINK_SEARCH, THINK_ANSWER, RIGHT, WRONG = SCRIPTED_TEXTS


def tool_call_text(query: str) -> str:
    body = json.dumps({"name": "search", "arguments": {"query_list": [query]}})
    return f"{THINK_SEARCH}\n<tool_call>\n{body}\n</tool_call>"


class ScriptedServer:
    """Stands in for verl's LLM server client: returns scripted replies as token ids, records every request."""

    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        self.tokenizer = tokenizer
        self.replies = list(replies)
        self.prompts: list[list[int]] = []
        self.sampling_params: list[dict[str, Any]] = []

    async def generate(
        self, *, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any
    ):
        from verl.workers.rollout.replica import TokenOutput

        self.prompts.append(list(prompt_ids))
        self.sampling_params.append(dict(sampling_params))
        ids = self.tokenizer.encode(self.replies.pop(0) + "<|im_end|>", add_special_tokens=False)
        return TokenOutput(
            token_ids=ids,
            log_probs=[-0.5] * len(ids),
            stop_reason="completed",
            extra_fields={"min_global_steps": 7, "max_global_steps": 7},  # what verl's server manager adds
        )


def _settings(tmp_path: Path, qa_sample: Path, url: str) -> TrainSettings:
    return fixture_settings(tmp_path, qa_sample, [url], logger="console")


def _dataset_row(settings: TrainSettings, cfg: Any, tokenizer: Any, tmp_path: Path) -> dict[str, Any]:
    from omegaconf import open_dict
    from verl.utils.dataset.rl_dataset import RLHFDataset

    data_cfg = cfg.data.copy()
    with open_dict(data_cfg):
        data_cfg.cache_dir = str(tmp_path / "verl-cache")
    dataset = RLHFDataset([str(settings.train_file), str(settings.test_file)], tokenizer, data_cfg)
    for i in range(len(dataset)):
        row = dataset[i]
        if row["extra_info"]["question"] == SEVENTH_SEAL_QUESTION:
            return row
    raise AssertionError("Seventh Seal question missing from the prepared data")


async def _run_loop(
    cfg: Any, tokenizer: Any, row: dict[str, Any], replies: list[str], calls: list[dict], loop_cls: Any = None
):
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.tools.tool_registry import load_all_tools
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from searchrl.trainer.plugins.agent_loop import SearchToolAgentLoop

    # verl's own loader builds our tool from the YAML that trainer/toolconfig.py wrote.
    tools = load_all_tools(cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path, None)
    (tool,) = tools
    real_execute = tool.execute

    async def spy(instance_id, parameters, **kwargs):
        calls.append(parameters)
        return await real_execute(instance_id, parameters, **kwargs)

    tool.execute = spy
    server = ScriptedServer(tokenizer, replies)
    try:
        loop = (loop_cls or SearchToolAgentLoop)(  # every run's loop: verl's ToolAgentLoop plus its record
            trainer_config=DictConfigWrap(cfg),
            server_manager=server,
            tokenizer=tokenizer,
            processor=None,
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(cfg.data),
            hf_model_type="qwen2",
            tools=ToolListWrap(tools),
        )
        output = await loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1}, **row)
    finally:
        await tool.aclose()
    return output, server


async def _reward(cfg: Any, tokenizer: Any, row: dict[str, Any], output: Any) -> dict[str, Any]:
    """verl's reward path for one trajectory, built the way AgentLoopWorker._compute_score builds it."""
    import torch
    from tensordict import TensorDict
    from verl.protocol import DataProto
    from verl.trainer.ppo.reward import load_reward_manager

    manager = load_reward_manager(cfg, tokenizer)
    prompts = torch.tensor([output.prompt_ids])
    responses = torch.tensor([output.response_ids])
    batch = TensorDict(
        {
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": torch.ones(1, prompts.shape[1] + responses.shape[1], dtype=torch.int64),
        },
        batch_size=1,
    )
    non_tensor = {
        "data_source": np.array([row["data_source"]], dtype=object),
        "reward_model": np.array([row["reward_model"]], dtype=object),
        "extra_info": np.array([dict(row["extra_info"])], dtype=object),
        "__num_turns__": np.array([output.num_turns]),
        "tool_extra_fields": np.array([output.extra_fields], dtype=object),
    }
    return await manager.run_single(DataProto(batch=batch, non_tensor_batch=non_tensor))


async def _scored_run(
    cfg: Any, tokenizer: Any, row: dict[str, Any], replies: list[str], loop_cls: Any
) -> tuple[Any, Any, list[dict], dict[str, Any]]:
    """One trajectory through verl's agent loop and then verl's reward path: (output, server, tool calls, reward)."""
    calls: list[dict] = []
    output, server = await _run_loop(cfg, tokenizer, row, replies, calls, loop_cls)
    return output, server, calls, await _reward(cfg, tokenizer, row, output)


def test_tool_agent_loop_searches_live_service_and_scores_answer(
    tmp_path, live_bm25_url, offline_tokenizer, compose, qa_sample
):
    from verl.utils.config import omega_conf_to_dataclass

    tok = offline_tokenizer
    settings = _settings(tmp_path, qa_sample, live_bm25_url)
    prepare_data(settings)
    write_tool_config(settings)
    cfg = compose(render_overrides(settings))
    assert omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout).multi_turn.enable
    row = _dataset_row(settings, cfg, tok, tmp_path)
    assert row["agent_name"] == "searchrl_tool_agent"  # a GPU run's loop: ours, no scripted turn
    from searchrl.trainer.plugins.agent_loop import SearchToolAgentLoop
    from searchrl.trainer.plugins.generated_spans import SPANS, parse_spans, span_step_metrics

    async def both():
        results = {}
        for name, final in (("right", RIGHT), ("wrong", WRONG)):
            replies = [tool_call_text(SEVENTH_SEAL_QUESTION), f"{THINK_ANSWER}\n{final}"]
            results[name] = await _scored_run(cfg, tok, row, replies, SearchToolAgentLoop)
        return results

    results = asyncio.run(both())
    output, server, calls, reward = results["right"]

    # The tool was called once, with the query the model wrote (the question), through the live service.
    assert calls == [{"query_list": [SEVENTH_SEAL_QUESTION]}]
    assert output.extra_fields["search_calls"] == 1 and output.extra_fields["search_failures"] == 0
    assert output.num_turns == 4  # user prompt, assistant (search), tool, assistant (answer)

    # The second generation saw the observation: the right passage, framed as a hermes tool response.
    assert len(server.prompts) == 2
    second_prompt = tok.decode(server.prompts[1])
    assert (
        "<tool_response>\nDoc 1 (Title: The Seventh Seal) The Seventh Seal is a 1957 Swedish" in second_prompt
    )
    assert "written and directed by Ingmar Bergman" in second_prompt

    # Observation tokens are masked out of the loss (0); only the model's own tokens count (1).
    ids, mask = np.array(output.response_ids), np.array(output.response_mask)
    assert len(ids) == len(mask) and set(mask.tolist()) == {0, 1}
    model_text = tok.decode(ids[mask == 1].tolist())
    observation_text = tok.decode(ids[mask == 0].tolist())
    assert (
        model_text
        == tool_call_text(SEVENTH_SEAL_QUESTION) + "<|im_end|>" + f"{THINK_ANSWER}\n{RIGHT}<|im_end|>"
    )
    assert "Doc 1 (Title: The Seventh Seal)" in observation_text and "<tool_response>" in observation_text
    # The response is one contiguous story: model turn, observation, model turn.
    changes = np.flatnonzero(np.diff(mask)).size
    assert changes == 2 and mask[0] == 1 and mask[-1] == 1
    # the loop recorded both generated turns, and mask 1 falls exactly on them
    spans = parse_spans(output.extra_fields[SPANS])
    assert len(spans) == 2 and [i for s, e in spans for i in range(s, e)] == np.flatnonzero(mask).tolist()
    assert set(span_step_metrics([(output.extra_fields, mask.tolist())]).values()) == {0.0}

    # verl's reward manager, loading our reward via pkg://searchrl.trainer.plugins.reward: EM 1.0, with F1/format/search metrics.
    assert reward["reward_score"] == 1.0
    info = reward["reward_extra_info"]
    assert info["em"] == 1.0 and info["f1"] == 1.0 and info["format_valid"] == 1.0
    assert info["search_calls"] == 1.0 and info["search_failures"] == 0.0

    _, _, wrong_calls, wrong_reward = results["wrong"]
    assert wrong_calls == [{"query_list": [SEVENTH_SEAL_QUESTION]}]
    assert wrong_reward["reward_score"] == 0.0
    assert wrong_reward["reward_extra_info"]["format_valid"] == 1.0


def test_failed_searches_stop_the_run_through_verls_reward_path(
    tmp_path, offline_tokenizer, compose, qa_sample, monkeypatch
):
    """Dead service -> our tool's failure kinds in the loop's extra_fields -> verl's reward manager -> our reward
    function with the limits from reward_kwargs -> SearchFailureRateError out of verl's scoring call."""
    import searchrl.trainer.plugins.reward
    from searchrl.errors import SearchFailureRateError
    from tests.conftest import free_port

    monkeypatch.setattr(searchrl.trainer.plugins.reward, "_windows", {})
    settings = _settings(tmp_path, qa_sample, f"http://127.0.0.1:{free_port()}").model_copy(
        update={"retrieval_max_retries": 0, "max_search_failure_rate": 0.5, "search_failure_window": 10}
    )
    prepare_data(settings)
    write_tool_config(settings)
    cfg = compose(render_overrides(settings))
    row = _dataset_row(settings, cfg, offline_tokenizer, tmp_path)

    async def run():
        replies = [tool_call_text(SEVENTH_SEAL_QUESTION), f"{THINK_ANSWER}\n{RIGHT}"]
        output, _ = await _run_loop(cfg, offline_tokenizer, row, replies, [])
        assert output.extra_fields["search_failure_kinds"] == "connect"
        for _ in range(9):  # nine failed searches: the window of ten is not full yet
            await _reward(cfg, offline_tokenizer, row, output)
        with pytest.raises(
            SearchFailureRateError, match=r"100\.0% of the last 10 searches failed \(connect x10\)"
        ):
            await _reward(cfg, offline_tokenizer, row, output)

    asyncio.run(run())


def _scripted_cfg(
    tmp_path: Path, qa_sample: Path, url: str, compose: Any, extra: tuple[str, ...] | list[str] = ()
) -> tuple[TrainSettings, Any]:
    """A CPU run's agent loop config: the scripted loop's name (trainer/proofs/train_cpu.py `cpu_settings`)."""
    from searchrl.trainer.cpu.scripted_agent_loop import SCRIPTED_AGENT_NAME

    settings = _settings(tmp_path, qa_sample, url).model_copy(update={"agent_loop": SCRIPTED_AGENT_NAME})
    prepare_data(settings)
    write_tool_config(settings)
    cfg = compose(
        [
            *render_overrides(settings),
            "+actor_rollout_ref.rollout.engine_kwargs.searchrl.scripted_first_turn=True",
            *extra,
        ]
    )
    return settings, cfg


@pytest.mark.parametrize("sabotaged", [False, True], ids=["masked", "sabotage-observations-in-loss"])
def test_the_scripted_first_turn_is_environment_and_the_mask_check_sees_observations(
    tmp_path, live_bm25_url, offline_tokenizer, compose, qa_sample, monkeypatch, sabotaged
):
    """The CPU runs' agent loop writes the first call itself with loss mask 0; the model's own turn is the only
    mask-1 text; the sampler's mask metric (from the token strings) finds the tool response and counts 0 trained
    tokens in it, and counts them all when the observations-in-loss sabotage is on."""
    from searchrl.trainer.cpu import sabotage
    from searchrl.trainer.cpu.scripted_agent_loop import (
        SCRIPTED_AGENT_NAME,
        ScriptedToolAgentLoop,
        scripted_tool_call,
    )
    from searchrl.trainer.plugins.agent_loop import SearchToolAgentLoop
    from searchrl.trainer.plugins.generated_spans import (
        LAST_TURN,
        MISSING,
        OUTSIDE,
        SPANS,
        TOOL_RESPONSES,
        UNRECORDED,
        parse_spans,
        span_step_metrics,
    )
    from searchrl.trainer.plugins.masks import mask_step_metrics
    from searchrl.trainer.plugins.metrics import search_step_metrics

    if sabotaged:
        monkeypatch.setenv(sabotage.ENV, sabotage.OBSERVATIONS_IN_LOSS)
    tok = offline_tokenizer
    settings, cfg = _scripted_cfg(tmp_path, qa_sample, live_bm25_url, compose)
    row = _dataset_row(settings, cfg, tok, tmp_path)
    assert row["agent_name"] == SCRIPTED_AGENT_NAME
    calls: list[dict] = []
    reply = f"{THINK_ANSWER}\n{RIGHT}"
    # every run's loop scripts nothing: given the CPU runs' switch it refuses to start rather than run unscripted
    with pytest.raises(ValueError, match="engine_kwargs.searchrl.scripted_first_turn is set, but agent loop"):
        asyncio.run(_run_loop(cfg, tok, row, [reply], calls, SearchToolAgentLoop))
    assert calls == []
    output, server = asyncio.run(_run_loop(cfg, tok, row, [reply], calls, ScriptedToolAgentLoop))

    assert calls == [{"query_list": [SEVENTH_SEAL_QUESTION]}]  # the scripted call reached the live service
    assert len(server.prompts) == 1  # the server generated only the model's own turn
    assert (
        output.extra_fields["min_global_steps"] == 7
    )  # the trainer's step metrics read it from every sample
    ids, mask = np.array(output.response_ids), np.array(output.response_mask)
    metrics = mask_step_metrics([(tok.convert_ids_to_tokens(ids.tolist()), mask.tolist())])
    assert metrics["loss/observation_tokens"] > 20
    # the record of what the server generated: one span, the model's own turn, at the end of the response
    spans = parse_spans(output.extra_fields[SPANS])
    assert spans == [(len(ids) - len(tok.encode(reply + "<|im_end|>", add_special_tokens=False)), len(ids))]
    assert output.extra_fields[LAST_TURN] == reply and output.extra_fields[TOOL_RESPONSES] == 1
    invariant = span_step_metrics([(output.extra_fields, mask.tolist())])
    if sabotaged:
        assert metrics["loss/observation_tokens_in_loss"] == metrics["loss/observation_tokens"]
        # the invariant catches it too, without reading the text: every tool-turn token is off the record
        assert invariant[OUTSIDE] >= metrics["loss/observation_tokens"] and invariant[MISSING] == 0
        return
    assert metrics["loss/observation_tokens_in_loss"] == 0
    assert invariant == {OUTSIDE: 0.0, MISSING: 0.0, UNRECORDED: 0.0}
    assert tok.decode(ids[mask == 1].tolist()) == reply + "<|im_end|>"
    assert scripted_tool_call(SEVENTH_SEAL_QUESTION) in tok.decode(ids[mask == 0].tolist())
    steps = search_step_metrics([output.extra_fields])
    assert (
        steps["search/calls"] == 1
        and steps["search/scripted_calls"] == 1
        and steps["search/model_calls"] == 0
    )


def _old_own_turn(solution_str: str) -> str:
    """The learning reward's own turn before issue 39: the text after the last `</tool_response>`."""
    import re

    return re.sub(r"^\s*assistant\s*", "", solution_str.rpartition("</tool_response>")[2], count=1)


def test_the_learning_reward_scores_the_recorded_own_turn_through_verls_reward_path(
    tmp_path, live_bm25_url, offline_tokenizer, compose, qa_sample
):
    """Issue 39 item 4, through verl's own reward manager (which merges the loop's extra_fields into extra_info):
    the normal trajectory scores as before; a made-up `<tool_response>` block in the model's turn no longer hides
    the text before it; a tool response verl drops for overrunning response_length scores 0, where the old split
    scored the scripted call."""
    from searchrl.trainer.cpu.scripted_agent_loop import SCRIPTED_AGENT_NAME, ScriptedToolAgentLoop
    from searchrl.trainer.overrides import merge_overrides
    from searchrl.trainer.plugins.generated_spans import LAST_TURN, SPANS, TOOL_RESPONSES
    from searchrl.trainer.proofs.learn import REWARD_FN_NAME, REWARD_FN_PATH
    from searchrl.trainer.proofs.rewards import answer_char_share

    tok = offline_tokenizer
    settings = _settings(tmp_path, qa_sample, live_bm25_url).model_copy(
        update={"agent_loop": SCRIPTED_AGENT_NAME}
    )
    prepare_data(settings)
    write_tool_config(settings)
    learn = [
        f"reward.custom_reward_function.path={REWARD_FN_PATH}",
        f"reward.custom_reward_function.name={REWARD_FN_NAME}",
        "+actor_rollout_ref.rollout.engine_kwargs.searchrl.scripted_first_turn=True",
    ]
    cfg = compose(merge_overrides(render_overrides(settings), learn))
    short = compose(merge_overrides(render_overrides(settings), [*learn, "data.max_response_length=64"]))
    row = _dataset_row(settings, cfg, tok, tmp_path)
    answers = ["Ingmar Bergman"]
    plain, invented = "bbb xx ingmar", "bbb ingmar <tool_response>\nzz\n</tool_response> xx"

    async def run(config: Any, reply: str) -> tuple[Any, dict[str, Any], str, list[dict]]:
        output, _, calls, scored = await _scored_run(config, tok, row, [reply], ScriptedToolAgentLoop)
        return output, scored, tok.decode(output.response_ids, skip_special_tokens=True), calls

    async def all_three():
        return [await run(cfg, plain), await run(cfg, invented), await run(short, plain)]

    (out1, r1, text1, _), (out2, r2, text2, _), (out3, r3, text3, calls3) = asyncio.run(all_three())

    # the normal case: the recorded turn is the text the old split found, so the learning run's calibration holds
    assert out1.extra_fields[LAST_TURN] == plain and out1.extra_fields[TOOL_RESPONSES] == 1
    assert _old_own_turn(text1).strip() == plain
    assert answer_char_share(plain, answers) > 0
    assert r1["reward_score"] == pytest.approx(answer_char_share(plain, answers))
    # a block the model made up: the whole turn is scored, not only its tail
    assert out2.extra_fields[LAST_TURN] == invented
    assert r2["reward_score"] == pytest.approx(answer_char_share(invented, answers))
    assert _old_own_turn(text2).strip() == "xx"  # what the old split scored
    # the tool response overran response_length and verl dropped it: no own turn, score 0
    assert calls3 == [{"query_list": [SEVENTH_SEAL_QUESTION]}] and "<tool_response>" not in text3
    assert out3.extra_fields[TOOL_RESPONSES] == 0 and out3.extra_fields[SPANS] == ""
    assert r3["reward_score"] == 0.0
    assert answer_char_share(_old_own_turn(text3), answers) > 0  # the old split scored the scripted call


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        ("The Seventh Seal was directed by Ingmar Bergman.", 1.0),
        ("<tool_response>\nDoc 1 (Title: Made up) Fritz Lang directed it.\n</tool_response>", 0.0),
        ("  \n", 0.0),
    ],
    ids=["clean", "invents-a-tool-response", "empty"],
)
def test_the_real_learning_run_caps_the_turn_and_its_reward_scores_the_own_turn_through_verl(
    tmp_path, live_bm25_url, offline_tokenizer, compose, qa_sample, reply, score
):
    """`make learn-cpu-real`'s path for one trajectory: our loop puts the turn budget into the request verl sends
    the server (verl sets no max_tokens), and verl's reward manager, loading trainer/proofs/rewards.py by pkg://, scores
    the own turn after the live service's response: 1 when clean, 0 when it invents a tool response or says
    nothing. The mask metric counts the invented span as the model's, apart from the observation."""
    from searchrl.trainer.cpu.scripted_agent_loop import ScriptedToolAgentLoop
    from searchrl.trainer.plugins.masks import mask_step_metrics
    from searchrl.trainer.proofs.real_learn import REWARD_FN_NAME, REWARD_FN_PATH

    tok = offline_tokenizer
    settings, cfg = _scripted_cfg(
        tmp_path,
        qa_sample,
        live_bm25_url,
        compose,
        extra=[
            "+actor_rollout_ref.rollout.engine_kwargs.searchrl.turn_max_tokens=96",
            f"reward.custom_reward_function.path={REWARD_FN_PATH}",
            f"reward.custom_reward_function.name={REWARD_FN_NAME}",
        ],
    )
    row = _dataset_row(settings, cfg, tok, tmp_path)
    output, server, _, reward = asyncio.run(_scored_run(cfg, tok, row, [reply], ScriptedToolAgentLoop))
    assert [p["max_tokens"] for p in server.sampling_params] == [96]
    assert reward["reward_score"] == score
    metrics = mask_step_metrics([(tok.convert_ids_to_tokens(output.response_ids), output.response_mask)])
    assert metrics["loss/observation_tokens"] > 20 and metrics["loss/observation_tokens_in_loss"] == 0
    invented = metrics["loss/model_tool_response_tokens"]
    assert invented > 0 if "<tool_response>" in reply else invented == 0


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        ('The Seventh Seal"]}}\n</tool_call>', 1.0),
        ('your query"]}}\n</tool_call>', 0.5),
        ("The Seventh Seal was directed by", 0.0),
    ],
    ids=["closes-and-retrieves", "closes-with-a-junk-query", "never-closes"],
)
def test_the_query_stage_scripts_the_call_opening_as_environment_and_scores_the_query_through_verl(
    tmp_path, live_bm25_url, offline_tokenizer, compose, qa_sample, reply, score
):
    """`make learn-cpu-real --stage query` for one trajectory, with its own overrides (learn_overrides): the loop
    writes the search-call opening after the generation prompt with loss mask 0, the server continues it (its
    prompt ends with the opening), the model's text is the only mask-1 span and the recorded own turn, verl runs
    no tool (the trajectory ends with the model's one turn), and verl's reward manager, loading
    trainer/proofs/real_query.py by pkg://, searches the live BM25 service with the closed call's query: 1.0 when the
    top-3 holds a golden answer ("Ingmar Bergman"), 0.5 for a closed call whose query finds none, 0 unclosed."""
    from searchrl.trainer.cpu.scripted_agent_loop import ScriptedToolAgentLoop
    from searchrl.trainer.plugins.generated_spans import LAST_TURN, SPANS, parse_spans
    from searchrl.trainer.proofs.real_learn import learn_overrides
    from searchrl.trainer.proofs.real_query import OPENING

    tok = offline_tokenizer
    stage = [
        o
        for o in learn_overrides("float32", 0, 48, stage="query", retrieval_url=live_bm25_url)
        if "scripted_opening" in o or "max_assistant_turns" in o or "reward" in o or "turn_max_tokens" in o
    ]
    settings, cfg = _scripted_cfg(tmp_path, qa_sample, live_bm25_url, compose, extra=stage)
    cfg.actor_rollout_ref.rollout.engine_kwargs.searchrl.scripted_first_turn = (
        False  # as cpu_overrides(False) sets it
    )
    row = _dataset_row(settings, cfg, tok, tmp_path)
    output, server, calls, reward = asyncio.run(_scored_run(cfg, tok, row, [reply], ScriptedToolAgentLoop))
    opening = tok.encode(OPENING, add_special_tokens=False)
    assert len(server.prompts) == 1 and server.prompts[0][-len(opening) :] == opening
    assert [p["max_tokens"] for p in server.sampling_params] == [48]
    assert calls == []  # the call is the reward's to run, not verl's
    ids, mask = np.array(output.response_ids), np.array(output.response_mask)
    generated = tok.encode(reply + "<|im_end|>", add_special_tokens=False)
    assert ids[: len(opening)].tolist() == opening and mask[: len(opening)].tolist() == [0] * len(opening)
    assert tok.decode(ids[mask == 1].tolist()) == reply + "<|im_end|>" and len(ids) == len(opening) + len(
        generated
    )
    assert parse_spans(output.extra_fields[SPANS]) == [(len(opening), len(ids))]
    assert output.extra_fields[LAST_TURN] == reply
    assert reward["reward_score"] == score
