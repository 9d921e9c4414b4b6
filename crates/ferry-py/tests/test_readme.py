"""The README's two Python examples run as written: consumer.py and producer.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import HERE

pytest.importorskip("numpy")

README = os.path.join(HERE, os.pardir, "README.md")


def examples() -> list[str]:
    with open(README) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def test_readme_consumer_and_producer_run(group_name, tmp_path):
    consumer, producer = examples()
    assert consumer.startswith("# consumer.py") and producer.startswith("# producer.py")
    scripts = {}
    for name, code in (("consumer", consumer), ("producer", producer)):
        # The examples' group, renamed so that the test leaves no file of its own.
        scripts[name] = tmp_path / f"{name}.py"
        scripts[name].write_text(code.replace('"camera"', repr(group_name)))
    c = subprocess.Popen(
        [sys.executable, str(scripts["consumer"])], stdout=subprocess.PIPE, text=True
    )
    try:
        consumer_id = c.stdout.readline().strip()
        assert re.fullmatch(r"\d+\.\d+", consumer_id), consumer_id
        subprocess.run(
            [sys.executable, str(scripts["producer"]), consumer_id], check=True, timeout=120
        )
        out, _ = c.communicate(timeout=120)
        assert out.split("\n")[:3] == ["42 False"] * 3
        assert c.returncode == 0
    finally:
        if c.poll() is None:
            c.kill()
            c.wait()
