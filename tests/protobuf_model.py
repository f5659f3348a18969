"""A small seeded model for the protobuf tests, imported both by the test
process and by the upstream subprocess (through PYTHONPATH), so the two build
the very same weights."""

import torch


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(11, 4)
        self.block = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.LayerNorm(6))
        self.register_buffer("steps", torch.arange(5, dtype=torch.int64))


def model(seed: int) -> Small:
    torch.manual_seed(seed)
    return Small()
