"""``tessera agent --once --spec-file``: bad spec files are usage errors naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.cli.main import main


@pytest.mark.parametrize(("content", "problem"), [
    (b"\xff\xfe\x00k\x00i\x00n\x00d", "is not UTF-8 text"),
    (b"spec: [unclosed", "is not valid YAML or JSON at line"),
    (b"- just\n- a list\n", "is not a NodePartition object"),
])
def test_a_bad_spec_file_exits_2_naming_the_file_and_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, problem: str,
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(content)
    code = main(["agent", "--once", "--spec-file", str(spec), "--nvml", "sim:" + str(
        tmp_path / "node.json"), "--no-kubelet"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--spec-file" in err
    assert str(spec) in err
    assert problem in err
    assert "Traceback" not in err
