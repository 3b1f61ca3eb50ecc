"""One rank for the multi-host tests (started by torch.distributed.run; not a test module):
joins the gloo group, all-reduces its rank and writes what it saw to ``OUT/rank<R>.json``.

    python -m torch.distributed.run ... tests/support/rdzv_probe.py OUT
"""

import json
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from amptrain.core.lifeline import leave_process_group

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank)])
dist.all_reduce(total)
seen = {
    "rank": rank,
    "world_size": world,
    "rank_sum": total.item(),
    "group_rank": int(os.environ["GROUP_RANK"]),
    "master_addr": os.environ["MASTER_ADDR"],
    "hostname": socket.gethostname(),
}
Path(sys.argv[1], f"rank{rank}.json").write_text(json.dumps(seen))
dist.destroy_process_group()
leave_process_group(0)
