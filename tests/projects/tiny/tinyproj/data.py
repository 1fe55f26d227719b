import csv

import torch


def load_points(path: str) -> tuple[torch.Tensor, torch.Tensor]:
    with open(path, newline="") as handle:
        rows = [
            [float(value) for value in row]
            for row in csv.reader(handle)
            if row and not row[0].startswith("#")
        ]
    data = torch.tensor(rows)
    return data[:, :-1], data[:, -1]
