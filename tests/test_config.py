"""A misspelt setting fails loudly in every area (issue 27 item 1): env, .env, keyword, and `sky --env`."""

from __future__ import annotations

from pathlib import Path

import pytest

from searchrl.cli import main
from searchrl.config import load_settings
from searchrl.errors import ConfigError
from searchrl.infer.settings import InferSettings
from searchrl.retrieval.settings import RetrievalSettings
from searchrl.trainer.settings import TrainSettings


@pytest.mark.parametrize(
    ("cls", "typo", "meant"),
    [
        (RetrievalSettings, "SEARCHRL_RETRIEVAL_BACKEN", "SEARCHRL_RETRIEVAL_BACKEND"),
        (InferSettings, "SEARCHRL_INFER_LLM_URLL", "SEARCHRL_INFER_LLM_URL"),
        (TrainSettings, "SEARCHRL_TRAIN_TOTAL_STEPZ", "SEARCHRL_TRAIN_TOTAL_STEPS"),
    ],
)
def test_misspelt_env_names_the_closest_setting(
    monkeypatch: pytest.MonkeyPatch, cls: type, typo: str, meant: str
) -> None:
    monkeypatch.setenv(typo, "1")
    with pytest.raises(ConfigError) as info:
        load_settings(cls)
    assert str(info.value) == f"unknown setting {typo} in the environment: did you mean {meant}?"


def test_misspelt_dotenv_key_and_keyword(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("SEARCHRL_RETRIEVAL_PORT=9000\nsearchrl_infer_concurency=4\n")
    assert RetrievalSettings().port == 9000  # other areas' keys in a shared .env are fine
    with pytest.raises(
        ConfigError, match=r"SEARCHRL_INFER_CONCURENCY in \.env: did you mean SEARCHRL_INFER_CONCURRENCY"
    ):
        InferSettings()
    with pytest.raises(
        ConfigError, match="unknown setting topkk passed to RetrievalSettings: did you mean topk"
    ):
        RetrievalSettings(topkk=3)
    # aliases and pydantic-settings options are known names
    assert RetrievalSettings(RETRIEVAL_API_KEY="k", _env_file=None).api_key_value() == "k"


def test_serve_with_misspelt_env_exits_2_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SEARCHRL_RETRIEVAL_BACKEN", "dense")
    monkeypatch.setattr(
        "searchrl.retrieval.serving.server.run_server", lambda _s: pytest.fail("served anyway")
    )
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: unknown setting SEARCHRL_RETRIEVAL_BACKEN in the environment: "
        "did you mean SEARCHRL_RETRIEVAL_BACKEND?\n"
    )


def test_sky_validate_refuses_unknown_searchrl_env(capsys: pytest.CaptureFixture[str]) -> None:
    # refused before SkyPilot is imported or .venv-sky is re-executed, so this runs without SkyPilot
    assert (
        main(["sky", "validate", "--env", "SEARCHRL_RETRIEVAL_BACKEN=dense", "--env", "DATASET_SIZE=small"])
        == 2
    )
    assert capsys.readouterr().err == (
        "error: unknown setting SEARCHRL_RETRIEVAL_BACKEN passed with --env: did you mean SEARCHRL_RETRIEVAL_BACKEND?\n"
    )
    for verb in (["train", "--dry-run"], ["serve", "--dry-run"]):
        assert main(["sky", *verb, "--env", "SEARCHRL_INDEX_BUCKKET=b"]) == 2
        assert "did you mean SEARCHRL_INDEX_BUCKET?" in capsys.readouterr().err
