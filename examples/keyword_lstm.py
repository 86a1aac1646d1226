"""A second user's model in plain ``torch.nn``, of a family no zoo of perfzoo has: a two-layer LSTM over a
``(frames, features)`` sequence of audio features (e.g. 98 frames of 40 filter-bank energies, one second of
speech) and a linear head on its last state, as a keyword spotter.

    perfzoo predict examples/keyword_lstm.py:build --batch 16 --input 98,40 --mode inference

Random weights; nothing is downloaded.
"""

from torch import Tensor, nn


class KeywordLSTM(nn.Module):
    """LSTM over the frames, a linear head on the last frame's state."""

    def __init__(self, features: int, hidden: int, layers: int, num_classes: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        states, _ = self.lstm(x)
        return self.head(states[:, -1])


def build(features: int = 40, hidden: int = 128, layers: int = 2, num_classes: int = 100) -> nn.Module:
    """The keyword spotter for ``features`` values per frame (the number of frames is free)."""
    return KeywordLSTM(features, hidden, layers, num_classes)
