"""`tunix-rt chat RUN` chats with the run's tools (config.yaml `tools`) and says so;
`--no-tools` turns them off."""

from __future__ import annotations

import shutil

import pytest
import yaml


@pytest.mark.parametrize("flag,banner", [([], ", tools: calculator;"), (["--no-tools"], ";")])
def test_chat_uses_the_runs_tools_unless_turned_off(home, flag, banner):
    from typer.testing import CliRunner

    from tunix_rt.cli import app
    from tunix_rt.models.store import ensure_model

    run = home.runs / "grpo-tiny-tools"
    shutil.copytree(ensure_model("tiny-gemma3", home), run / "final" / "merged")
    (run / "config.yaml").write_text(yaml.safe_dump({"model": "tiny-gemma3", "system_prompt": "", "tools": ["calculator"]}))
    result = CliRunner().invoke(app, ["chat", run.name, "--device", "cpu", *flag], input="/quit\n")
    assert result.exit_code == 0, result.output
    assert f"chatting with {run.name} (run){banner} /reset" in result.output
