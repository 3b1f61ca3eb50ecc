"""amptrain's training engine: a pure PyTorch library.

Torch-free modules (importable by the API): ``spec``, ``records``, ``errors``,
``catalog``. Everything else needs torch.
"""
