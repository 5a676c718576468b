import pytest
import torch
import torch.nn as nn

#: scripts the remote tests start as processes (they read sys.argv at import): not test modules
collect_ignore_glob = ["remote_scripts/*"]

pytest_plugins = ["browser"]  # one JupyterLab server and one Chromium for every browser test (tests/browser.py)


class Block(nn.Module):
    """A reused Linear and a residual add."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return self.lin(self.lin(x)) + x


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.block = Block()
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        x = self.fc1(x)
        x.add_(1.0)  # in-place op on an activation
        x = self.act(x)
        return self.fc2(self.block(x))


def train_steps(model, steps=2, dbg=None, batch=5, lr=0.1, seed=0):
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        x = torch.randn(batch, 8, generator=g)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), torch.zeros(batch, 4))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return opt, losses


@pytest.fixture
def net():
    torch.manual_seed(0)
    return Net()
