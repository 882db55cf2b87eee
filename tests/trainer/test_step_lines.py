"""trainer/step_lines.py and trainer/patches/step_line.py: a step line Ray forwarded in pieces is one row again.

A CI run lost step 16 this way ("verl logged no response_length/mean, timing_s/step"). The unit tests cut a real
step line at every position, with another actor's line between the pieces; the live one has a real Ray actor
write its line in two parts, as Ray's log monitor (`readline()` on the actor's file) catches one mid-write, and the
real supervisor read it.
"""

from __future__ import annotations

import ast
import inspect
import io
import sys
import textwrap
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from searchrl.trainer.step_checks import check_steps, parse_steps
from searchrl.trainer.step_lines import LINE_END, LINE_END_KEY, MAX_PIECES, StepLines
from searchrl.trainer.supervisor import supervise

RUNNER = "\x1b[36m(TaskRunnerV1 pid=6421)\x1b[0m "
OTHER = "\x1b[36m(WorkerDict pid=6500)\x1b[0m Qwen2ForCausalLM contains 148.93K parameters"
BODY = (
    "step:16 - search/trajectories:4.0 - search/calls:4.0 - search/model_calls:0.0 - search/scripted_calls:4.0 - "
    "search/failures:0.0 - actor/pg_loss:-0.0123 - actor/grad_norm:0.269 - critic/score/mean:0.78125 - "
    "critic/advantages/max:1.41 - training/rollout_probs_diff_max:5.5e-07 - loss/observation_tokens:300.0 - "
    "loss/observation_tokens_in_loss:0.0 - loss/mask_outside_generated:0.0 - response_length/mean:192.0 - "
    "timing_s/step:8.6" + LINE_END
)


def _fed(lines: list[str], marked: bool = True) -> list[str]:
    assembler = StepLines(marked=marked)
    out = [ready for line in lines for ready in assembler.feed(line + "\n")]
    return out + assembler.flush()


def test_a_whole_step_line_passes_at_once_and_other_lines_are_untouched() -> None:
    assembler = StepLines()
    assert assembler.feed(RUNNER + BODY + "\n") == [RUNNER + BODY]
    assert assembler.feed(OTHER + "\n") == [OTHER]
    assert assembler.feed("plain driver line\n") == ["plain driver line"]


def test_a_step_line_cut_anywhere_is_whole_again_with_another_actors_line_between() -> None:
    """Every cut position, numbers included (`critic/score/mean:0.78125` cut after its 0 would read 0.0): the
    row is the uncut line's, and the other actor's line is handed on unchanged."""
    (whole,) = parse_steps(RUNNER + BODY, "1")
    for cut in range(1, len(BODY)):
        out = _fed([RUNNER + BODY[:cut], OTHER, RUNNER + BODY[cut:]])
        assert out == [OTHER, RUNNER + BODY], cut
        (row,) = parse_steps(out[1], "1")
        assert row.metrics == whole.metrics, cut


def test_a_line_cut_in_three_and_an_actor_on_another_node() -> None:
    prefix = "(TaskRunnerV1 pid=12, ip=10.0.0.7) "
    pieces = [BODY[:40], BODY[40:41], BODY[41:]]
    step15 = prefix + BODY.replace("step:16", "step:15")  # a patched run: its step lines end
    assert _fed([step15, *(prefix + piece for piece in pieces)]) == [step15, prefix + BODY]


def test_a_cut_line_that_never_ends_is_handed_on_as_it_is_and_the_check_names_what_is_missing() -> None:
    """Its actor's next step line, or the end of the output, hands it on: the step checks name the metrics it
    lacks, as before the patch, instead of a cut value passing for a whole one."""
    cut = BODY.index("response_length")
    assert _fed([RUNNER + BODY[:cut], RUNNER + BODY.replace("step:16", "step:17")]) == [
        RUNNER + BODY[:cut],
        RUNNER + BODY.replace("step:16", "step:17"),
    ]
    (ready,) = _fed([RUNNER + BODY[:cut]])
    (row,) = parse_steps(ready, "1")
    assert "step 16: verl logged no response_length/mean, timing_s/step" in check_steps([row], 16)
    # in a patched run (a step line has ended), pieces that never bring the end: handed on after MAX_PIECES
    pieces = [RUNNER + "x"] * MAX_PIECES
    assert _fed([RUNNER + BODY, RUNNER + BODY[:cut], *pieces])[1:] == [RUNNER + BODY[:cut] + "x" * MAX_PIECES]


def test_a_verl_without_the_patch_turns_the_joining_off_after_its_first_step_line() -> None:
    """An unpatched verl's first step line is held until its actor's next line, which does not end it: both are
    handed on as they came (nothing glued on), `unmarked` is set, and no later line waits."""
    unmarked = BODY.removesuffix(LINE_END)
    later = RUNNER + unmarked.replace("step:16", "step:17")
    assert _fed([RUNNER + unmarked, OTHER], marked=False) == [RUNNER + unmarked, OTHER]
    for after in (RUNNER + "Training Progress: 5%", later):
        assembler = StepLines()
        assert assembler.feed(RUNNER + unmarked + "\n") == []
        assert assembler.feed(after + "\n") == [RUNNER + unmarked, after]
        assert assembler.unmarked and not assembler.marked
        assert assembler.feed(later + "\n") == [later]  # at once


def test_verls_console_logger_ends_its_step_line_with_the_marker_once_patched() -> None:
    from verl.utils.logger import LocalLogger

    from searchrl.trainer.patches import step_line

    step_line.install()
    step_line.install()  # idempotent: one marker, not two
    printed = io.StringIO()
    with redirect_stdout(printed):
        LocalLogger(print_to_console=True).log({"critic/score/mean": 0.5, "timing_s/step": 1.25}, step=3)
    line = printed.getvalue()
    assert line == f"step:3 - critic/score/mean:0.5 - timing_s/step:1.25{LINE_END}\n"
    (row,) = parse_steps(line, "1")
    assert row.metrics == {"critic/score/mean": 0.5, "timing_s/step": 1.25, LINE_END_KEY: 1.0}


def test_verls_console_logger_still_prints_concat_dict_to_str() -> None:
    """The pin check (trainer/patches/README.md): verl 0.9.1's `LocalLogger.log` prints the module's
    `concat_dict_to_str` (utils/logger/aggregate_logger.py:49-51), which the patch wraps. If a release prints its
    step line some other way, this fails and the patch must follow."""
    from verl.utils.logger.aggregate_logger import LocalLogger

    tree = ast.parse(textwrap.dedent(inspect.getsource(LocalLogger.log)))
    called = [
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    ]
    assert "concat_dict_to_str" in called and "print" in called


# A Ray actor printing a marked step line the way Ray's log monitor catches one mid-write: the first part, a pause
# longer than the monitor's poll, the rest. Then a whole line for step 2.
RAY_SCRIPT = """
import sys, time
import ray
line = sys.argv[1]
ray.init(num_cpus=1, include_dashboard=False, log_to_driver=True)

@ray.remote(num_cpus=0)
class TaskRunnerV1:
    def run(self, line):
        cut = line.index("critic/score/mean:0.7") + len("critic/score/mean:0.7")
        print(line[:cut], end="", flush=True)
        time.sleep(1.5)
        print(line[cut:], flush=True)
        print(line.replace("step:16", "step:17"), flush=True)
        time.sleep(1.5)

ray.get(TaskRunnerV1.remote().run.remote(line))
ray.shutdown()
"""


@pytest.mark.live
@pytest.mark.timeout(180)
def test_a_step_line_a_real_ray_actor_wrote_in_two_parts_reaches_the_check_whole(tmp_path: Path) -> None:
    rows = []
    log = tmp_path / "verl.log"
    code = supervise(
        [sys.executable, "-c", RAY_SCRIPT, BODY],
        on_step=lambda row: rows.append(row) or [],
        log_path=log,
        env={"RAY_DEDUP_LOGS": "0"},
        timeout_s=150,
    )
    assert code == 0, log.read_text()[-2000:]
    raw = [line for line in log.read_text().splitlines() if "TaskRunnerV1 pid" in line]
    assert any("step:16" in line and not line.endswith(LINE_END) for line in raw), raw  # Ray did cut it
    assert [row.step for row in rows] == [16, 17]
    (whole,) = parse_steps(BODY, "")
    assert rows[0].metrics == whole.metrics  # critic/score/mean 0.78125, not the 0.7 the cut left
