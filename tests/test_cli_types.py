"""``queuert-notify pause``, ``resume`` and ``limits``: operating a job type from a shell."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from queuert_notify.cli import main


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def test_pause_shows_in_chains_list_until_resume(tmp_path: Path, prefix: str) -> None:
    common = ("--database-url", f"sqlite:///{tmp_path}/jobs.db", "--table-prefix", f"{prefix}_")
    assert _invoke("migrate", *common)[0] == 0
    code, output = _invoke("pause", *common, "send-email")
    assert code == 0, output
    code, output = _invoke("chains", "list", *common)
    assert code == 0 and "send-email: paused; no limits" in output, output
    code, output = _invoke("chains", "list", *common, "--json")
    assert json.loads(output)["paused_types"] == ["send-email"]
    code, output = _invoke("resume", *common, "send-email")
    assert code == 0 and "resumed send-email" in output, output
    code, output = _invoke("chains", "list", *common, "--json")
    assert json.loads(output)["paused_types"] == []


def test_limits_are_set_shown_and_lifted(tmp_path: Path, prefix: str) -> None:
    common = ("--database-url", f"sqlite:///{tmp_path}/jobs.db", "--table-prefix", f"{prefix}_")
    assert _invoke("migrate", *common)[0] == 0
    code, output = _invoke(
        "limits",
        *common,
        "charge-card",
        "--concurrency=20",
        "--key-concurrency=1",
        "--rate=100",
        "--per=1s",
    )
    assert code == 0, output
    expected = "charge-card: concurrency 20, 1 per concurrency key, 100 started per 1s"
    assert expected in output
    code, output = _invoke("limits", *common, "charge-card", "--json")
    assert json.loads(output) == {
        "type_name": "charge-card",
        "paused": False,
        "concurrency": 20,
        "key_concurrency": 1,
        "rate": 100,
        "per_seconds": 1.0,
    }
    code, output = _invoke("chains", "list", *common)
    assert expected in output
    code, output = _invoke("limits", *common, "charge-card", "--none")
    assert code == 0 and "charge-card: no limits" in output, output


def test_a_rate_without_a_window_is_refused_with_the_reason(tmp_path: Path, prefix: str) -> None:
    common = ("--database-url", f"sqlite:///{tmp_path}/jobs.db", "--table-prefix", f"{prefix}_")
    assert _invoke("migrate", *common)[0] == 0
    code, output = _invoke("limits", *common, "charge-card", "--rate=100")
    assert code == 1 and "InvalidInputError: rate and per go together" in output, output
    code, output = _invoke("limits", *common, "charge-card", "--rate=100", "--per=soon")
    assert code == 2 and "not a duration" in output, output
