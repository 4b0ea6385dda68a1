"""The code a plain state_dict's results are keyed by (``landscape.analyze.model_code``, issue 46 W1): every edit
to code or a value that ``forward`` reaches changes ``model_sha256``; what it does not reach does not."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest
from support.helpers import write_user_module

from landscape.analyze.state_dict_source import model_sha256

NETS = textwrap.dedent('''
    import torch
    from torch import nn

    DEPTH = 2
    UNUSED = 1


    def inner(x):
        return x.clamp(min=-3.0)


    def outer(x, gain=1.5):  # calls another helper; a default argument
        return inner(x) * gain


    TABLE = {"squash": outer}


    def make_shift(k):
        def shift(x):
            return x + k
        return shift


    SHIFT = make_shift(0.5)  # a closure's value


    class Base(nn.Module):
        def finish(self, x):
            return TABLE["squash"](x)


    class Net(Base):
        def __init__(self):
            super().__init__()
            self.layers = nn.Sequential(*[nn.Linear(4, 4) for _ in range(DEPTH)])

        def forward(self, x):
            return SHIFT(self.finish(self.layers(x)))


    def make():
        torch.manual_seed(0)
        return Net()


    def unrelated():
        return UNUSED
''')


@pytest.mark.parametrize("old, new, changes", [
    ("return x.clamp(min=-3.0)", "return x.clamp(min=-2.0)", True),  # a helper a helper calls
    ("gain=1.5", "gain=2.5", True),  # a default argument
    ("make_shift(0.5)", "make_shift(0.25)", True),  # a value a closure holds
    ("def finish(self, x):\n        return TABLE", "def finish(self, x):\n        return 2 * TABLE", True),  # a base
    ("UNUSED = 1", "UNUSED = 2", False),  # a constant forward never reads
    ("return UNUSED", "return UNUSED + 1", False),  # a function forward never calls
])
def test_model_sha256_follows_the_code_forward_reaches(tmp_path, monkeypatch, old, new, changes):
    name = write_user_module(tmp_path, monkeypatch, "nets", NETS)
    module = importlib.import_module(name)
    before = model_sha256(module.make, module.make())
    path = tmp_path / f"{name}.py"
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new))
    sys.modules.pop(name)
    importlib.invalidate_caches()
    module = importlib.import_module(name)
    try:
        assert (model_sha256(module.make, module.make()) != before) is changes
    finally:
        sys.modules.pop(name, None)
