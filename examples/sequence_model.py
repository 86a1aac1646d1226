"""A user's own model in plain ``torch.nn``, of a family no zoo of perfzoo has: a 1-D convolutional front
end, a GRU and a linear head over a ``(channels, length)`` sequence, e.g. 12-lead signals of 256 samples.

    perfzoo predict examples/sequence_model.py:build --batch 8 --input 12,256 --mode training

Random weights; nothing is downloaded.
"""

from torch import Tensor, nn


class ConvGRUClassifier(nn.Module):
    """Conv1d front end (stride 2, twice), a GRU over the shortened sequence, a linear head on its last
    state."""

    def __init__(self, channels: int, width: int, hidden: int, layers: int, num_classes: int) -> None:
        super().__init__()
        self.front = nn.Sequential(
            nn.Conv1d(channels, width, kernel_size=7, stride=2, padding=3),
            nn.BatchNorm1d(width),
            nn.ReLU(),
            nn.Conv1d(width, width, kernel_size=5, stride=2, padding=2),
            nn.BatchNorm1d(width),
            nn.ReLU(),
        )
        self.gru = nn.GRU(width, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        features = self.front(x).transpose(1, 2)  # (batch, length / 4, width)
        states, _ = self.gru(features)
        return self.head(states[:, -1])


def build(channels: int = 12, width: int = 128, hidden: int = 256, layers: int = 2,
          num_classes: int = 100) -> nn.Module:
    """The classifier for ``channels``-channel inputs (the input length is free)."""
    return ConvGRUClassifier(channels, width, hidden, layers, num_classes)
