"""sky/infer.yaml's comparison: wiki-18 by default (the bundled subset is a smoke test), columns named by what each
service serves, page mode passed to the Google service. Its run section runs through SkyPilot's own codegen in a
fake node (tests/test_sky_yaml.py's harness), so what is checked is the command SkyPilot would run."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.test_sky_yaml import SKY, run_node

RECIPE = yaml.safe_load((SKY / "infer.yaml").read_text())


def test_the_recipe_defaults_to_wiki18() -> None:
    envs = RECIPE["envs"]
    assert envs["SEARCHRL_RETRIEVAL_CORPUS"] == "wiki18"
    assert envs["SEARCHRL_RETRIEVAL_ENCODER"] == "intfloat/e5-base-v2"  # wiki-18's prebuilt index is E5
    assert envs["WIKI_URL"] == "" and envs["GOOGLE_PAGE_MODE"] == "false"
    setup = RECIPE["setup"]
    assert ":wiki18) searchrl index download wiki18 && searchrl index download wiki18-e5-index ;;" in setup
    assert RECIPE["resources"]["disk_size"] >= 256 and RECIPE["resources"]["memory"] == "96+"


def test_columns_are_named_by_the_services(tmp_path: Path) -> None:
    rc, stdout, calls = run_node("infer.yaml", tmp_path)
    assert rc == 0, stdout[-2000:]
    lines = calls.splitlines()
    assert "searchrl serve --backend dense --host 127.0.0.1 --port 8001" in lines  # wiki served on this node
    assert "searchrl health http://127.0.0.1:8001 --deadline 2400" in lines
    (compare,) = [ln for ln in lines if ln.startswith("searchrl compare")]
    # bare URLs: `compare` labels each column from the service's GET / (wiki18, google-snippets, ...)
    assert "--backends http://127.0.0.1:8001,http://127.0.0.1:8002 " in compare
    assert "wikipedia=" not in compare and "google=" not in compare
