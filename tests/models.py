"""Small models shared by the tests: quick on two CPU cores."""

import torch
from torch import nn


class Fn(nn.Module):
    """A model that is one function of its inputs (an op under test)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *inputs):
        return self.fn(*inputs)


class TinyTransformer(nn.Module):
    """Token embedding, two pre-norm encoder layers, a language-model head."""

    def __init__(self, vocab=50, width=32, heads=4, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.1, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)))


class TinyCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1, groups=2),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Dropout(0.2),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(self.pool(self.features(x)).flatten(1))


class TinyLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(12, 24, num_layers=2, bidirectional=True, batch_first=True)
        self.out = nn.Linear(48, 3)

    def forward(self, x):
        return self.out(self.lstm(x)[0][:, -1])


def workloads():
    """(name, model factory, inputs) for the agreement tests."""
    return [
        ("cnn", TinyCNN, torch.randn(2, 3, 16, 16)),
        ("transformer", TinyTransformer, torch.randint(0, 50, (2, 12))),
        ("lstm", TinyLSTM, torch.randn(2, 9, 12)),
    ]


MEMORY_FIELDS = ("memory", "peak_memory_bytes", "peak_activation_bytes")


def flop_figures(result):
    """A profile's FLOP figures: everything but where it ran, memory (tested apart), and
    the zero-FLOP bookkeeping ops (copies, detaches), whose calls legitimately differ
    between fake and real kernels."""
    data = result.to_dict()
    for key in ("device", "analytic", *MEMORY_FIELDS):
        del data[key]
    for module in data["modules"]:
        del module["activation_bytes"], module["forward_peak_bytes"], module["backward_peak_bytes"]
        module["ops"] = [op for op in module["ops"] if op["flops"]]
    data["ops"] = [{k: v for k, v in op.items() if k != "allocated_bytes"} for op in data["ops"] if op["flops"]]
    return data
