"""Fixtures of the command-line tests."""

import pytest

from flowkit.cli import main


@pytest.fixture
def usage_error(capsys):
    """`usage_error(argv)`: run a command line the parser refuses; returns its error line (exit code 2 checked)."""

    def run(argv):
        with pytest.raises(SystemExit) as exit:
            main(argv)
        assert exit.value.code == 2
        return capsys.readouterr().err.strip().splitlines()[-1]

    return run
