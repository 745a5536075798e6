"""Frozen parameters under the peer's own optimizer on torch 2.x (run by scripts/peer.sh; ctest -R Peer).

Builds Ultralytics 8.0.232's DetectionModel and its optimizer (BaseTrainer.build_optimizer: SGD, three groups,
weight decay on the convolution weights), freezes layer 0 and the DFL projection the way its trainer's `freeze`
setting does (requires_grad off for names containing 'model.0.' and '.dfl'), and runs three steps ending in the
trainer's `optimizer.zero_grad()`. On torch 2.x that sets gradients to None, and torch's optimizers skip
parameters without one: the frozen ones must come out bit-identical, with no momentum buffer, as ours do
(tests/trainer/core/train_step_test.cpp, TrainStep.FrozenLayersGetNeitherDecayNorMomentumAndGradientsAreCleared).
Prints one JSON line; exit 1 if any of that does not hold.
"""
import json
import sys
import types

import torch
from ultralytics.engine.trainer import BaseTrainer
from ultralytics.nn.tasks import DetectionModel


def main() -> int:
    torch.manual_seed(0)
    model = DetectionModel("yolov8n.yaml", nc=3, verbose=False)
    model.train()
    frozen_names = ("model.0.", ".dfl")
    for name, param in model.named_parameters():
        param.requires_grad = not any(part in name for part in frozen_names)
    trainer = types.SimpleNamespace(args=types.SimpleNamespace(warmup_bias_lr=0.1, lr0=0.01, momentum=0.937))
    optimizer = BaseTrainer.build_optimizer(trainer, model, name="SGD", lr=0.01, momentum=0.937, decay=0.05)
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    images = torch.rand(2, 3, 64, 64)
    for _ in range(3):
        feats = model(images)
        loss = sum(f.float().square().mean() for f in feats)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()  # the trainer's call; torch 2.x: set_to_none=True
    frozen, moved, failures = 0, 0, []
    for name, param in model.named_parameters():
        if param.grad is not None:
            failures.append(f"{name}: a gradient is left after zero_grad")
        if any(part in name for part in frozen_names):
            frozen += 1
            if not torch.equal(before[name], param.detach()):
                failures.append(f"{name}: changed while frozen")
            if param in optimizer.state and optimizer.state[param]:
                failures.append(f"{name}: has optimizer state {sorted(optimizer.state[param])}")
        elif not torch.equal(before[name], param.detach()):
            moved += 1
    result = {"torch": torch.__version__, "frozen": frozen, "moved": moved, "failures": failures}
    print(json.dumps(result))
    return 0 if not failures and frozen == 4 and moved > 100 else 1


if __name__ == "__main__":
    sys.exit(main())
