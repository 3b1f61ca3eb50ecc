"""The probe model's registration (torch-free, like every registration)."""

from amptrain.contract.catalog import Arg, Registration

PROBE = Registration(
    name="ddp-probe",
    kind="model",
    builder="amptrain_ddp_probe.torch_parts:build_probe",
    description="Two-layer MLP that can SIGTERM one rank mid-run and writes parameter digests.",
    args=(
        Arg("width", 32, "Hidden width.", minimum=1),
        Arg("signal_rank", -1, "Rank that sends itself SIGTERM (-1: none).", minimum=-1),
        Arg("signal_at", 0, "Training forward pass (1-based) during which it does.", minimum=0),
        Arg("digest_dir", "", "Directory for digest-rank{r}.txt at exit ('' : none)."),
        Arg("hang_rank", -1, "Rank that hangs, ignoring stop signals (-1: none).", minimum=-1),
        Arg("hang_at", 0, "Training forward pass (1-based) during which it does.", minimum=0),
        Arg("hang_until", "", "It goes on once this file exists ('': never)."),
        Arg(
            "pace",
            0.0,
            "Seconds each training forward pass sleeps first.",
            minimum=0.0,
            maximum=1.0,
        ),
    ),
    accepts=("vectors",),
)
