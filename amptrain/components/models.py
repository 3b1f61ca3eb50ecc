"""Built-in models. Each builder takes the dataset's ``DataInfo`` and its arguments
(declared, with the same defaults, in ``amptrain.contract.catalog``) and returns a
module whose ``forward(inputs)`` returns logits: ``(batch, classes)`` for
classification, ``(batch, seq_len, vocab)`` for language models."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from amptrain.components.base import DataInfo


class MLP(nn.Module):
    """Flatten, then ``depth`` x (Linear, LayerNorm, GELU, Dropout), then a linear head."""

    def __init__(self, in_features: int, classes: int, width: int, depth: int, dropout: float):
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        size = in_features
        for _ in range(depth):
            layers += [nn.Linear(size, width), nn.LayerNorm(width), nn.GELU(), nn.Dropout(dropout)]
            size = width
        layers.append(nn.Linear(size, classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def build_mlp(info: DataInfo, width: int = 256, depth: int = 2, dropout: float = 0.0) -> nn.Module:
    return MLP(math.prod(info.input_shape), info.num_classes, width, depth, dropout)


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 convs with BatchNorm and a (projected) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        # Zero-init the last BN so every block starts as the identity (trains faster).
        nn.init.zeros_(self.bn2.weight)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class SmallResNet(nn.Module):
    """Stem, ``depth`` basic blocks (channels double and resolution halves after the first),
    global average pooling and a linear head."""

    def __init__(self, channels: int, size: int, classes: int, width: int, depth: int):
        super().__init__()
        # Large images get an ImageNet-style strided stem so compute stays small.
        big = size >= 64
        stem: list[nn.Module] = [
            nn.Conv2d(channels, width, 3, 2 if big else 1, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
        ]
        if big:
            stem.append(nn.MaxPool2d(3, 2, 1))
        self.stem = nn.Sequential(*stem)
        blocks = []
        cin = width
        for i in range(depth):
            cout = width * 2 ** min(i, 3)
            blocks.append(BasicBlock(cin, cout, 1 if i == 0 else 2))
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


def build_cnn(info: DataInfo, width: int = 32, depth: int = 3) -> nn.Module:
    channels, height, width_px = info.input_shape
    return SmallResNet(channels, min(height, width_px), info.num_classes, width, depth)


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, d_model: int, n_heads: int, mlp_ratio: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, mlp_ratio * d_model),
            nn.GELU(),
            nn.Linear(mlp_ratio * d_model, d_model),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """GPT-style causal language model with a head tied to the token embedding."""

    def __init__(
        self,
        vocab: int,
        context: int,
        d_model: int,
        n_layers: int,
        n_heads: int,
        mlp_ratio: int,
        dropout: float,
    ):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(context, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(
            *(Block(d_model, n_heads, mlp_ratio, dropout) for _ in range(n_layers))
        )
        self.ln_f = nn.LayerNorm(d_model)
        self.apply(self._init)
        # GPT-2: scale residual projections by depth so the residual stream stays O(1).
        for name, p in self.named_parameters():
            if name.endswith(("proj.weight", "mlp.2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * n_layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.drop(self.tok(tokens) + self.pos(positions))
        h = self.ln_f(self.blocks(h))
        return F.linear(h, self.tok.weight)


def build_transformer(
    info: DataInfo,
    d_model: int = 128,
    n_layers: int = 2,
    n_heads: int = 4,
    mlp_ratio: int = 4,
    dropout: float = 0.0,
) -> nn.Module:
    return TinyGPT(
        info.num_classes, info.input_shape[0], d_model, n_layers, n_heads, mlp_ratio, dropout
    )
