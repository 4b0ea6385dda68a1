"""LEAF's next-character model for Shakespeare (models/shakespeare/stacked_lstm.py in TalwalkarLab/leaf): an
embedding of 8 per character, two stacked LSTM layers of 256 and a linear layer on the last step's output.

The LSTM is written out from linear maps and the gate functions (no fused or cuDNN kernel), so vmapped clients
and Hessian-vector products (a second derivative) run through it on every device and dtype. The cell is
TensorFlow's BasicLSTMCell that LEAF's model uses: gates i, g, f, o from [x, h], the forget gate's bias offset by
1 (``forget_bias``), c' = sigmoid(f + 1) c + sigmoid(i) tanh(g), h' = sigmoid(o) tanh(c'); states start at 0.
Initialisation is PyTorch's for an LSTM (every weight and bias uniform in +-1/sqrt(hidden)), its embedding's
and linear layer's defaults.
"""

from __future__ import annotations

import math

import torch
from torch import nn

FORGET_BIAS = 1.0  # TensorFlow's BasicLSTMCell default, which LEAF's model keeps


class LSTMLayer(nn.Module):
    """One LSTM layer over a whole sequence: [B, L, input] -> the hidden state at every step [B, L, hidden]."""

    def __init__(self, input_size: int, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.input = nn.Linear(input_size, 4 * hidden)  # the gates' input part and their bias, i | g | f | o
        self.recurrent = nn.Linear(hidden, 4 * hidden, bias=False)
        bound = 1.0 / math.sqrt(hidden)
        for parameter in self.parameters():
            nn.init.uniform_(parameter, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        projected = self.input(x)  # every step's input part at once
        h = projected.new_zeros(projected.shape[0], self.hidden)
        c = h
        steps = []
        for t in range(projected.shape[1]):
            i, g, f, o = (projected[:, t] + self.recurrent(h)).chunk(4, dim=-1)
            c = torch.sigmoid(f + FORGET_BIAS) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            steps.append(h)
        return torch.stack(steps, dim=1)


class StackedLSTM(nn.Module):
    """Token indices [B, L] (any dtype holding whole numbers: the data sets' inputs are float) -> logits."""

    def __init__(self, vocabulary: int, embedding: int, hidden: int, layers: int, num_classes: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, embedding)
        self.layers = nn.ModuleList(LSTMLayer(embedding if k == 0 else hidden, hidden) for k in range(layers))
        self.out = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embedding(x.long())
        for layer in self.layers:
            h = layer(h)
        return self.out(h[:, -1])
