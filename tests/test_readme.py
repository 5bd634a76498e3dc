"""The README's environment table and test command stay true to the code."""

from pathlib import Path

from jit_mla.env import ENV_VARS

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_every_environment_variable_is_in_the_readme_table():
    for name in ENV_VARS:
        assert f"| `{name}` |" in README, f"{name} missing from README's environment table"


def test_readme_shows_the_ci_test_command():
    ci = (Path(__file__).resolve().parent.parent / ".ci" / "run").read_text()
    assert 'test_command="python -m pytest -q tests"' in ci
    assert "python -m pytest -q tests" in README
