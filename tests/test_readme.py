"""The README's commands are the ones CI runs."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"<!-- ci -->\n```bash\n(.*?)```", text, flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_ci_runs_exactly_the_readme_commands():
    commands = _readme_commands()
    assert len(commands) >= 3, "README lost its marked install/test commands"
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    ci_commands = [line for line in ci_lines if line and not line.startswith("#") and line not in
                   ("set -euo pipefail", 'cd "$(dirname "$0")/.."', "rm -rf .venv")]
    assert ci_commands == commands
