"""The Python examples of the README and the documentation pages run as written: the code blocks
are read from README.md and tools/docs/*.md, the names they leave to the reader (MyModel, data,
total, the swap directories) filled in with a small model and temporary directories, and what
they claim checked."""

import os
import re

import pytest
import torch

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
DOCS = os.path.join(ROOT, "tools", "docs")
PAGES = [os.path.join(ROOT, "README.md")] + sorted(
    os.path.join(DOCS, f) for f in os.listdir(DOCS) if f.endswith(".md"))


def python_blocks():
    """Every ```python block of the README and the documentation pages (indented ones in lists
    too), dedented; a block shown on two pages once."""
    text = ""
    for page in PAGES:
        with open(page, encoding="utf-8") as f:
            text += f.read() + "\n"
    blocks = []
    for m in re.finditer(r"^( *)```python\n(.*?)^\1```", text, re.S | re.M):
        indent = len(m.group(1))
        blocks.append("\n".join(line[indent:] for line in m.group(2).splitlines()))
    return list(dict.fromkeys(blocks))


def block_with(needle):
    found = [b for b in python_blocks() if needle in b]
    assert len(found) == 1, f"README and docs: {len(found)} python blocks contain {needle!r}"
    return found[0]


class MyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))).float()


def batches(n):
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 16, generator=gen).to(torch.bfloat16),
             torch.randint(0, 4, (8,), generator=gen)) for _ in range(n)]


def with_dirs(code, tmp_path, names):
    for name in names:
        (tmp_path / name).mkdir(exist_ok=True)
        code = code.replace(f"/{name}/ts", str(tmp_path / name))
    return code


def test_the_first_example_trains(tmp_path):
    code = with_dirs(block_with("tierswap.torch.AdamW(model.parameters(), lr=3e-4, weight_decay"),
                     tmp_path, ("nvme0", "nvme1"))
    env = {"MyModel": MyModel, "data": batches(6)}
    exec(compile(code, "README.md (Use it from PyTorch)", "exec"), env)
    opt, model = env["opt"], env["model"]
    assert opt.step_count == 6
    assert env["sched"].last_epoch == 6
    assert opt.param_groups[0]["lr"] < 3e-4  # the schedule reached the optimizer
    fresh = MyModel().to(torch.bfloat16)
    assert not torch.equal(fresh.a.weight, model.a.weight)  # the new values are in the model
    assert sorted(os.listdir(tmp_path / "nvme0")) == ["tierswap-rank0"]  # striped over both
    assert sorted(os.listdir(tmp_path / "nvme1")) == ["tierswap-rank0"]
    opt.close()


def test_the_resume_example_continues_a_run(tmp_path):
    import tierswap.torch
    (tmp_path / "nvme0").mkdir()
    model = MyModel().to(torch.bfloat16)
    first = tierswap.torch.AdamW(model.parameters(), lr=3e-4, swap_dir=str(tmp_path / "nvme0"),
                                 keep_swap_files=True, telemetry=False)
    for x, y in batches(3):
        torch.nn.functional.cross_entropy(model(x), y).backward()
        first.step()
        first.zero_grad()
    first.close()
    code = with_dirs(block_with("resume=True"), tmp_path, ("nvme0",))
    env = {"tierswap": tierswap, "torch": torch, "model": model, "total": 5}
    with pytest.warns(UserWarning, match="lr_scheduler.step"):  # torch's, said in the README
        exec(compile(code, "README.md (Resume after a crash)", "exec"), env)
    opt = env["opt"]
    assert opt.resumed and opt.step_count == 3
    assert env["sched"].last_epoch == 3  # the schedule replayed to the resumed step
    opt.close()


def test_every_python_example_is_covered():
    """A new ```python block in the README gets a test here (or is named as not runnable)."""
    covered = ("tierswap.torch.AdamW(model.parameters(), lr=3e-4, weight_decay", "resume=True",
               'service="/run/tierswap/service.sock"')
    for b in python_blocks():
        assert any(c in b for c in covered), f"README python block without a test:\n{b}"


def test_the_service_example_names_the_missing_service(tmp_path):
    """The service example needs a running `tierswap serve` (tested in test_serve.py); without
    one at its socket the constructor says which socket."""
    import tierswap.torch
    (tmp_path / "ts").mkdir()
    code = block_with('service="/run/tierswap/service.sock"')
    code = code.replace("/run/tierswap/service.sock", str(tmp_path / "no.sock"))
    code = code.replace("/var/tmp/ts", str(tmp_path / "ts"))
    env = {"tierswap": tierswap, "torch": torch, "model": MyModel().to(torch.bfloat16)}
    with pytest.raises(RuntimeError, match="no.sock"):
        exec(compile(code, "README.md (service)", "exec"), env)
