"""The command line as a shell user runs it: output piped into a reader that stops early."""

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = str(REPO / "data")


def _quiet(stderr: str) -> bool:
    return not any(s in stderr for s in ("Traceback", "BrokenPipeError", "Exception ignored"))


@pytest.mark.parametrize("args", [["policies"], ["--data-dir", DATA, "windows", "list"],
                                  ["--data-dir", DATA, "windows", "describe"], ["--help"]],
                         ids=["policies", "windows-list", "windows-describe", "help"])
def test_output_into_a_closed_pipe_ends_quietly(args):
    """The reader is gone before the first write (as `| head -0`): every write meets a broken pipe."""
    proc = subprocess.Popen([sys.executable, "-m", "portbench.cli", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    stderr = proc.stderr.read()
    rc = proc.wait(timeout=120)
    assert _quiet(stderr), stderr
    assert stderr == ""
    assert rc in (0, 141)   # 141: as a tool killed by SIGPIPE


@pytest.mark.parametrize("command", ["policies", "windows list"])
def test_pipe_into_head_ends_quietly(command):
    line = f"{shlex.quote(sys.executable)} -m portbench.cli --data-dir {shlex.quote(DATA)} {command} | head -1"
    done = subprocess.run(["sh", "-c", line], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert _quiet(done.stderr), done.stderr
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 1


def test_campaign_runs_a_policy_from_a_file(tmp_path):
    """`portbench campaign --policy-module FILE --policies ID`: your own scheduler, no package edit."""
    import shutil

    import pandas as pd

    from portbench import store
    from portbench.cli import main

    data = tmp_path / "data"                  # its cache goes here, not into the project's
    shutil.copytree(store.windows_dir(), data / "windows")
    module = tmp_path / "my_policy.py"
    module.write_text(
        "from portbench.policies import register\n"
        "from portbench.sim import Decision, Policy\n\n"
        "@register\n"
        "class NewestFirst(Policy):\n"
        "    name = 'newest_first_cli_test'\n"
        "    admission_only = True\n\n"
        "    def schedule(self, view):\n"
        "        return Decision(admit=sorted(view.waiting, reverse=True))\n")
    out = tmp_path / "table.parquet"
    rc = main(["--data-dir", str(data), "campaign", "--policy-module", str(module),
               "--policies", "newest_first_cli_test", "--limit-windows", "1", "--regions", "KNEE",
               "--slo-multipliers", "20", "--workers", "1", "--output", str(out), "--quiet"])
    assert rc == 0
    table = pd.read_parquet(out)
    assert set(table["policy"]) == {"newest_first_cli_test"} and len(table) == 3
    assert table["anwg"].between(0, 1).all()
