"""`make demo` runs to its delivery report (served admin excluded) on a private Redis."""

from __future__ import annotations

import re
import subprocess
import sys

from testproject.harness import REPO_ROOT, free_port


def test_demo_runs_to_a_report_whose_numbers_add_up(tmp_path):
    result = subprocess.run(
        [
            sys.executable, "scripts/demo.py", "--no-serve", "--tasks", "16",
            "--port", str(free_port()), "--run-dir", str(tmp_path), "--settle-s", "10",
        ],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    counts = {
        name: int(m.group(1))
        for name in ("pushed", "completed once", "in DLQ", "lost", "duplicated")
        if (m := re.search(rf"^\s+{name}\s+(\d+)$", out, re.M))
    }
    assert counts["pushed"] == 17, out  # 16 tasks and the poison one
    assert counts["in DLQ"] == 1, out  # the poison task
    assert counts["lost"] == 0, out  # the killed worker's tasks were resurrected
    assert counts["completed once"] + counts["duplicated"] + counts["in DLQ"] == 17, out
    assert re.search(r"the poison task is in the DLQ: reason exception", out), out
    brought_back = re.search(r"of the completed, (\d+) were brought back", out)
    assert brought_back and int(brought_back.group(1)) >= 1, out  # the SIGKILL's tasks
    assert "All demo processes stopped." in out
