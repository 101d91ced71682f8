from pathlib import Path

from edge_node.exit_codes import EXIT_CODE_HELP, ExitCode


def test_every_exit_code_has_help_and_is_in_the_readme():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for code in ExitCode:
        assert EXIT_CODE_HELP[code].strip(), code
        assert f"| {int(code)} |" in readme, f"exit code {int(code)} missing from the README table"
