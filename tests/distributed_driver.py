"""Test helper, run once per rank by a launcher: ``agentkit train`` through the CLI's ``main``, then
this rank's final weights to OUT/rank-R.safetensors (only the main rank writes a checkpoint).

    python -m torch.distributed.run --nproc_per_node 2 tests/distributed_driver.py OUT train ARGS...

With AGENTKIT_TEST_FSDP2=1 the ranks shard the model with FSDP2 although they run on CPU, where
accelerate itself would not (it enables FSDP for GPUs only); the loop's FSDP path is the same.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from safetensors.torch import save_file

from agentkit import cli
from agentkit.train import distributed

held = {}
prepare = distributed.Accelerated.prepare


def keep_sampler(self, policy, optimizer):
    model, optimizer, sampler = prepare(self, policy, optimizer)
    held["sampler"] = sampler
    return model, optimizer, sampler


distributed.Accelerated.prepare = keep_sampler

if os.environ.get("AGENTKIT_TEST_FSDP2") == "1":
    init = distributed.Accelerated.__init__

    def fsdp2_on_cpu(self):
        init(self)
        from accelerate import DistributedType
        from accelerate.utils import FullyShardedDataParallelPlugin

        self.accelerator.state.fsdp_plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
        self.accelerator.state.distributed_type = DistributedType.FSDP
        self.sharded = True

    distributed.Accelerated.__init__ = fsdp2_on_cpu

out = Path(sys.argv[1])
code = cli.main(sys.argv[2:])
if code == 0:
    weights = {name: value.detach().cpu().clone().contiguous() for name, value in held["sampler"].state_dict().items()}
    save_file(weights, str(out / f"rank-{os.environ['RANK']}.safetensors"))
sys.exit(code)
