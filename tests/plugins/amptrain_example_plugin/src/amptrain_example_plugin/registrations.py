"""What the entry points point at. Torch-free, so loading a registration is cheap;
the builders live in ``torch_parts`` and are imported only when a job uses them."""

from amptrain.contract.catalog import Arg, MetricRegistration, Registration

LOGREG = Registration(
    name="logreg",
    kind="model",
    builder="amptrain_example_plugin.torch_parts:build_logreg",
    description="Logistic regression (one linear layer on the flattened input).",
    args=(Arg("bias", True, "Learn a bias per class."),),
    accepts=("vectors", "images"),
)

BLOBS = Registration(
    name="example-blobs",
    kind="dataset",
    builder="amptrain_example_plugin.torch_parts:build_blobs",
    description="Gaussian blobs, one per class, at fixed random centres.",
    args=(
        Arg("features", 2, "Features per sample.", minimum=1),
        Arg("classes", 3, "Number of blobs (classes).", minimum=2),
        Arg("spread", 0.3, "Standard deviation of each blob.", minimum=0),
    ),
    provides="vectors",
)

BRIER = MetricRegistration(
    name="brier_score",
    compute="amptrain_example_plugin.torch_parts:brier_score",
    description="Brier score: squared distance of the predicted distribution from the label.",
    better="lower",
    tasks=("classification",),
)

KAPPA = MetricRegistration(
    name="cohen_kappa",
    # A torchmetrics.Metric class (the library's own here; a subclass of your own works the
    # same): built per job with the dataset's num_classes, updated with fp32 logits per
    # held-out micro-batch, computed (and gathered across data-parallel ranks) at the end.
    compute="torchmetrics.classification:MulticlassCohenKappa",
    description="Cohen's kappa: agreement of the predicted class with the label beyond chance.",
    better="higher",
    tasks=("classification",),
)
