"""The catalogue: every training arm, arm family and workload the experiments know.

Importing it fills :data:`~.arms.ARMS`, the families :func:`~.arms.get_arm` builds on
demand (``sync_b{b}``, ``ssp{s}``, ``local_sgd_h{H}``, ``diloco_h{H}``) and
:data:`~.arms.WORKLOADS`, from the modules that define them, imported directly:
:mod:`.families` (sync, parameter server), :mod:`.local` (Local SGD, DiLoCo),
:mod:`.gossip` (D-PSGD), :mod:`.compressed` (sync through a bf16/int8 wire,
PowerSGD or top-k) and :mod:`.lm` (the CNN held to 98 %, the byte-level LM).
Adding an arm, a family or a workload is one line here (or one
:func:`~.arms.register` call anywhere).
"""

from __future__ import annotations

from allreduce_jax.training import compressed, data, families, gossip, lm, local, models
from allreduce_jax.training.arms import (
  Workload,
  register,
  register_family,
  register_workload,
)


def digits_workload(model: str, target: float):
  """The digits task with ``models.make_model(model)``, ``target`` accuracy (0.9 smoke)."""

  def build(smoke: bool) -> Workload:
    return Workload(
      name=f"digits_{model}",
      data=data.load_digits(),
      make_model=lambda seed: models.make_model(model, seed),
      metric="accuracy",
      target=0.9 if smoke else target,
    )

  return build


for _arm in (
  families.sync_arm(0),
  families.sync_arm(1),
  families.sync_arm(2),
  families.overlapped_sync_arm(0),
  families.overlapped_sync_arm(1),
  families.balanced_arm(),
  families.isolate_arm(),
  families.ps_arm("async"),
  families.ps_arm("async_eta_tau"),
  families.ps_arm("dcasgd"),
  families.ps_arm("async", 1),
  families.ps_arm("async", 4),
  local.local_arm(8),
  local.diloco_arm(50),
  *(gossip.gossip_arm(mixing) for mixing in gossip.MIXINGS),
  *(compressed.compressed_arm(name, c) for name, c in compressed.COMPRESSED_ARMS.items()),
):
  register(_arm)

register_family("sync_b", families.sync_arm)
register_family("ssp", lambda s: families.ps_arm("async", s))
register_family("local_sgd_h", local.local_arm)
register_family("diloco_h", local.diloco_arm)

register_workload("digits_mlp", digits_workload("mlp", 0.95))
# The workloads that do not saturate: the CNN held to 98 %, the byte-level transformer LM.
register_workload("digits_cnn98", lm.cnn_strict_workload)
register_workload("lm", lm.lm_workload)
